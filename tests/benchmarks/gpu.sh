#!/usr/bin/env bash
# Trainer throughput on a CUDA machine, unattended, within TIME_LIMIT (8 minutes) on one H100/H200:
#
#   bash tests/benchmarks/gpu.sh
#
# 1. a float8 vs bf16 pair at FLOAT8_SIZE: tokens/s, and the loss over LOSS_STEPS steps on the same seeded batches
#    (the difference must stay within LOSS_BOUND, relative);
# 2. one step of BIG_SIZE with the AC mode and micro-batch `rrtrain plan` recommends for one GPU of this kind, its
#    measured peak memory against the plan's (within ±20%), or "not run" where the plan finds no setting that fits;
# 3. tokens/s/GPU, MFU, peak memory and step time for rr-60m ... rr-1b with `standard`, `standard` matched to
#    `review` (`standard@review`: match.reference=review) and `review`, bf16, FSDP2, compiled, at
#    train.micro_batch=auto; then review's time per token against its matched baseline beside their FLOP ratio.
# It prints the torch and torchao versions that ran, and the tables.
#
# Every measurement is `rrtrain bench`'s (the trainer's own step, rrtrain/training/step.py), all of them in one
# process (tests/benchmarks/gpu_matrix.py): Python, torch and CUDA start once. The interpreter is PYTHON, else
# .venv/bin/python when its torch sees CUDA, else python3, with this checkout on PYTHONPATH; it needs torch and
# pyyaml, and torchao for float8: when that cannot be imported and WHEELS holds a torchao wheel, it is installed
# from there into a temporary directory (no network; see docs/performance.md, "GPU").
# A measurement that fails (e.g. out of memory) is reported and the others go on; measurements that would
# start too late are skipped (the pair and the large model first, then the sizes from the largest down): the
# driver starts none within 25 s of TIME_LIMIT, and one still going 10 s before it is stopped, so the tables
# show what was measured. gpu_device.sh runs this script for three of its parts. Exit status 0 when every
# planned measurement was made (float8 may be reported as unsupported on a GPU without it) and the float8 loss
# stayed within its bound, else 1.
#
# Environment (defaults in brackets):
#   SIZES [rr-60m rr-150m rr-320m rr-590m rr-1b]   presets from configs/sizes/
#   VARIANTS [standard standard@review review]   residual rules; A@B: A parameter-matched to B
#   COMPILE_MODES [true]   train.compile settings to measure ("false true": eager too)
#   MICRO [auto]           sequences per GPU per step for every size: N, auto, shared (the largest auto chooses for
#                          every variant), or table (gpu_matrix.py's old table)
#   MICRO_<size> (e.g. MICRO_rr_1b)   the same for one size
#   STEPS [5] WARMUP [2]   timed and untimed optimizer steps per size measurement (warm-up covers compilation)
#   FLOAT8_SIZE [rr-1b]    the float8 pair's size ("" skips the pair); FLOAT8 [rowwise] the recipe (or tensorwise)
#   FLOAT8_MICRO [16] LOSS_STEPS [60] LOSS_BOUND [0.02] FLOAT8_COMPILE [true]
#   BIG_SIZE [frontier-7b] the large model ("" skips it); BIG_STEPS [2] BIG_WARMUP [1] BIG_COMPILE [true]
#   TIME_LIMIT [480]       seconds for the whole script (at least 60)
#   NGPU [1]               ranks (one per GPU; >1 runs under torchrun); the global batch is MICRO x NGPU
#   EXTRA []               more key=value overrides for every measurement (e.g. parallel.ac=selective)
#   RESULTS [a temporary file]   where the JSON lines of the measurements are kept
#   WHEELS [.whl]          a directory of wheels to install torchao from when it is missing
#   ALLOW_CPU [0]          1: run without CUDA (only to test this script on a CPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
START=$SECONDS

die() { echo "gpu.sh: error: $*" >&2; exit 1; }
. tests/benchmarks/gpu_python.sh
gpu_python gpu.sh "torch, yaml" float8

torchao_site gpu.sh

SIZES=${SIZES-"rr-60m rr-150m rr-320m rr-590m rr-1b"}
VARIANTS=${VARIANTS:-"standard standard@review review"}
COMPILE_MODES=${COMPILE_MODES:-"true"}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
MICRO=${MICRO:-auto}
FLOAT8_SIZE=${FLOAT8_SIZE-rr-1b}
BIG_SIZE=${BIG_SIZE-frontier-7b}
LOSS_BOUND=${LOSS_BOUND:-0.02}
TIME_LIMIT=${TIME_LIMIT:-480}
NGPU=${NGPU:-1}
[ "$TIME_LIMIT" -ge 60 ] 2>/dev/null || die "TIME_LIMIT must be at least 60 (seconds), got '$TIME_LIMIT'"
RESULTS=${RESULTS:-$(mktemp -t gpu-bench.XXXXXX.jsonl)}
: >"$RESULTS"

args=(measure --out "$RESULTS" --steps "$STEPS" --warmup "$WARMUP")
# shellcheck disable=SC2206  # word lists
args+=(--sizes $SIZES --variants $VARIANTS --compile $COMPILE_MODES)
for size in $SIZES; do
  var="MICRO_${size//-/_}"
  if [ -n "${!var:-}" ]; then args+=(--micro "$size=${!var}"); fi
done
args+=(--default-micro "$MICRO")
for kv in ${EXTRA:-}; do args+=(--set "$kv"); done
planned=$(( $(wc -w <<<"$SIZES") * $(wc -w <<<"$VARIANTS") * $(wc -w <<<"$COMPILE_MODES") ))
if [ -n "$FLOAT8_SIZE" ]; then
  args+=(--float8-size "$FLOAT8_SIZE" --float8 "${FLOAT8:-rowwise}" --float8-micro "${FLOAT8_MICRO:-16}"
         --loss-steps "${LOSS_STEPS:-60}" --float8-compile "${FLOAT8_COMPILE:-true}")
  planned=$(( planned + 2 ))
fi
if [ -n "$BIG_SIZE" ]; then
  args+=(--big-size "$BIG_SIZE" --big-steps "${BIG_STEPS:-2}" --big-warmup "${BIG_WARMUP:-1}"
         --big-compile "${BIG_COMPILE:-true}")
  planned=$(( planned + 1 ))
fi

# The driver's own budget leaves time to stop it and to print the table; `timeout` stops it regardless.
left=$(( TIME_LIMIT - (SECONDS - START) ))
args+=(--budget-s $(( left - 25 )))
echo "gpu.sh: $planned measurements in at most ${left}s; results in $RESULTS" >&2
if [ "$NGPU" -gt 1 ]; then
  launch=("$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU")
else
  launch=("$PY")
fi
timeout -k 5 $(( left - 10 )) "${launch[@]}" tests/benchmarks/gpu_matrix.py "${args[@]}"
rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "gpu.sh: stopped at the time limit" >&2; fi
"$PY" tests/benchmarks/gpu_matrix.py render "$RESULTS" --expect "$planned" --loss-bound "$LOSS_BOUND"
shown=$?
echo "gpu.sh: done in $(( SECONDS - START ))s" >&2
[ "$rc" = 0 ] && [ "$shown" = 0 ]

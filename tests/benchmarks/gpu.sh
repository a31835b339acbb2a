#!/usr/bin/env bash
# Trainer throughput on a CUDA machine: tokens/s/GPU, MFU, peak memory and step time for rr-60m ... rr-1b with
# `standard` and `review`, bf16, FSDP2, eager and torch.compile; prints a markdown table and the review/standard
# step-time ratio per size and mode. Unattended, within TIME_LIMIT (8 minutes) on one H100/H200:
#
#   bash tests/benchmarks/gpu.sh
#
# Every measurement is `rrtrain bench`'s (the trainer's own step, rrtrain/training/step.py, on random tokens), all of
# them in one process (tests/benchmarks/gpu_matrix.py): Python, torch and CUDA start once. Nothing is installed:
# the interpreter is PYTHON, else .venv/bin/python when its torch sees CUDA, else python3, with this checkout
# on PYTHONPATH; it needs torch and pyyaml only (not streaming, deepspeed or submitit).
# A measurement that fails (e.g. out of memory) is reported and the others go on; measurements that would
# start too late are skipped (eager ones run first, then compiled ones from the largest size down); a run
# still going at TIME_LIMIT is stopped and the table shows what was measured. Exit status 0 when every
# planned measurement was made, else 1.
#
# Environment (defaults in brackets):
#   SIZES [rr-60m rr-150m rr-320m rr-590m rr-1b]   presets from configs/sizes/
#   VARIANTS [standard review]   residual rules (standard: the plain pre-norm residual, comparable to the anchors)
#   COMPILE_MODES [false true]   train.compile settings to measure
#   MICRO_<size> (e.g. MICRO_rr_1b)   sequences per GPU per step [16 up to rr-320m, 8 above]; MICRO for other sizes
#   STEPS [8] WARMUP [2]   timed and untimed optimizer steps per measurement (warm-up covers compilation)
#   TIME_LIMIT [480]       seconds for the whole script
#   NGPU [1]               ranks (one per GPU; >1 runs under torchrun); the global batch is MICRO x NGPU
#   EXTRA []               more key=value overrides for every measurement (e.g. parallel.ac=selective)
#   RESULTS [a temporary file]   where the JSON lines of the measurements are kept
#   ALLOW_CPU [0]          1: run without CUDA (only to test this script on a CPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
START=$SECONDS

die() { echo "gpu.sh: error: $*" >&2; exit 1; }
has_cuda() { "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }

if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -x .venv/bin/python ] && has_cuda .venv/bin/python; then
  PY=.venv/bin/python
else
  PY=python3
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch, yaml" || die "$PY cannot import torch and yaml"
if [ "${ALLOW_CPU:-0}" != 1 ]; then
  has_cuda "$PY" || die "torch in $PY sees no CUDA device (set ALLOW_CPU=1 only to test this script)"
fi

SIZES=${SIZES:-"rr-60m rr-150m rr-320m rr-590m rr-1b"}
VARIANTS=${VARIANTS:-"standard review"}
COMPILE_MODES=${COMPILE_MODES:-"false true"}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-2}
TIME_LIMIT=${TIME_LIMIT:-480}
NGPU=${NGPU:-1}
[ "$TIME_LIMIT" -ge 90 ] 2>/dev/null || die "TIME_LIMIT must be at least 90 (seconds), got '$TIME_LIMIT'"
RESULTS=${RESULTS:-$(mktemp -t gpu-bench.XXXXXX.jsonl)}
: >"$RESULTS"

args=(measure --out "$RESULTS" --steps "$STEPS" --warmup "$WARMUP")
# shellcheck disable=SC2206  # word lists
args+=(--sizes $SIZES --variants $VARIANTS --compile $COMPILE_MODES)
for size in $SIZES; do
  var="MICRO_${size//-/_}"
  if [ -n "${!var:-}" ]; then args+=(--micro "$size=${!var}"); fi
done
[ -n "${MICRO:-}" ] && args+=(--default-micro "$MICRO")
for kv in ${EXTRA:-}; do args+=(--set "$kv"); done
planned=$(( $(wc -w <<<"$SIZES") * $(wc -w <<<"$VARIANTS") * $(wc -w <<<"$COMPILE_MODES") ))

# The driver's own budget leaves time to stop it and to print the table; `timeout` stops it regardless.
left=$(( TIME_LIMIT - (SECONDS - START) ))
args+=(--budget-s $(( left - 45 )))
"$PY" - <<'EOF' >&2
import torch
n = torch.cuda.device_count()
print(f"gpu.sh: torch {torch.__version__}, {n} CUDA device(s)" + (f": {torch.cuda.get_device_name(0)}" if n else ""))
EOF
echo "gpu.sh: $planned measurements in at most ${left}s; results in $RESULTS" >&2
if [ "$NGPU" -gt 1 ]; then
  launch=("$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU")
else
  launch=("$PY")
fi
timeout -k 10 $(( left - 15 )) "${launch[@]}" tests/benchmarks/gpu_matrix.py "${args[@]}"
rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "gpu.sh: stopped at the time limit" >&2; fi
"$PY" tests/benchmarks/gpu_matrix.py render "$RESULTS" --expect "$planned"
shown=$?
echo "gpu.sh: done in $(( SECONDS - START ))s" >&2
[ "$rc" = 0 ] && [ "$shown" = 0 ]

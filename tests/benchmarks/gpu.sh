#!/usr/bin/env bash
# Trainer throughput on a CUDA machine: tokens/s/GPU and MFU for rr-150m and rr-1b, bf16, FSDP2, eager and
# torch.compile, measured with `rrtrain bench --json` (whole optimizer steps on random tokens); prints a
# markdown table. From the repository root of a fresh clone (sized for under ~8 minutes on one H100/H200,
# the install included: 4 measurements of 13 optimizer steps each; not yet run on a GPU):
#
#   bash tests/benchmarks/gpu.sh
#
# It creates .venv (or uses the one there) and runs `pip install -e .` when rrtrain is not importable in it.
# Any failing run stops the script with its error output and a non-zero exit status.
#
# Environment (defaults in brackets):
#   NGPU [all visible]      ranks (one per GPU); the global batch is MICRO x NGPU, so figures are per GPU
#   SIZES [rr-150m rr-1b]   presets from configs/sizes/
#   VARIANTS [standard]     residual rules (standard: the plain pre-norm residual, comparable to the anchors;
#                           VARIANTS="standard review" also gives the review gate's step-time cost on GPU)
#   MICRO_rr_150m [16]  MICRO_rr_1b [8]   sequences of 1024 tokens per GPU per step (other sizes: MICRO [8])
#   COMPILE_MODES [false true]   train.compile settings to measure
#   STEPS [10] WARMUP [3]   timed and untimed optimizer steps (warm-up covers compilation)
#   RUN_TIMEOUT [300]       seconds allowed per measurement
#   EXTRA []                more key=value overrides for every run (e.g. parallel.ac=selective)
#   PYTHON [python3]        interpreter used to create .venv
#   ALLOW_CPU [0]           1: run without CUDA (only to test this script on a CPU machine)
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "gpu.sh: error: $*" >&2; exit 1; }

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "gpu.sh: creating .venv with $PYTHON" >&2
  "$PYTHON" -m venv .venv || die "could not create .venv"
fi
if ! .venv/bin/python -c "import rrtrain.bench" >/dev/null 2>&1; then
  echo "gpu.sh: pip install -e . into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip || die "pip upgrade failed"
  .venv/bin/python -m pip install -q -e . || die "pip install -e . failed"
fi
PY=.venv/bin/python

if [ "${ALLOW_CPU:-0}" != 1 ]; then
  "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || die "torch in .venv sees no CUDA device (set ALLOW_CPU=1 only to test this script)"
fi
NGPU=${NGPU:-$("$PY" -c "import torch; print(max(1, torch.cuda.device_count()))")}
SIZES=${SIZES:-"rr-150m rr-1b"}
VARIANTS=${VARIANTS:-standard}
COMPILE_MODES=${COMPILE_MODES:-"false true"}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
EXTRA=${EXTRA:-}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

"$PY" - <<'EOF' >&2
import torch
n = torch.cuda.device_count()
print(f"gpu.sh: torch {torch.__version__}, {n} CUDA device(s)" + (f": {torch.cuda.get_device_name(0)}" if n else ""))
EOF

results=()
for size in $SIZES; do
  var="MICRO_${size//-/_}"
  micro=${!var:-${MICRO:-8}}
  for variant in $VARIANTS; do
  for compile in $COMPILE_MODES; do
    name="${size}_${variant}_compile-${compile}"
    echo "gpu.sh: measuring $size $variant, compile=$compile, $micro seqs/GPU, $NGPU GPU(s) ..." >&2
    rc=0
    # shellcheck disable=SC2086  # EXTRA is a list of overrides
    timeout "$RUN_TIMEOUT" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" \
        -m rrtrain bench configs/train/tiny.yaml \
        model.size="$size" model.variant="$variant" parallel.backend=fsdp parallel.precision=bf16 \
        train.compile="$compile" train.micro_batch="$micro" train.global_batch=$((micro * NGPU)) $EXTRA \
        --steps "$STEPS" --warmup "$WARMUP" --json >"$OUT/$name.out" 2>"$OUT/$name.err" || rc=$?
    if [ "$rc" != 0 ]; then
      [ "$rc" = 124 ] && why="timed out after ${RUN_TIMEOUT}s" || why="exit status $rc"
      echo "gpu.sh: error: $name failed ($why); its output:" >&2
      tail -n 60 "$OUT/$name.err" >&2
      tail -n 20 "$OUT/$name.out" >&2
      exit 1
    fi
    grep '^{' "$OUT/$name.out" | tail -n 1 >"$OUT/$name.json" || true
    [ -s "$OUT/$name.json" ] || { tail -n 60 "$OUT/$name.err" >&2; die "$name printed no JSON result"; }
    results+=("$OUT/$name.json")
  done
  done
done

"$PY" - "${results[@]}" <<'EOF'
import json, sys

rows = [json.load(open(p)) for p in sys.argv[1:]]
r0 = rows[0]
print(f"\nrrtrain bench: {r0['device']} x {r0['world_size']}, FSDP2, bf16 (fp32 master weights and reductions), "
      f"AC {r0['ac']}, {r0['steps']} timed steps after {r0['warmup']} warm-up")
print(f"MFU = tokens/s x FLOPs/token / peak; FLOPs/token = 6N + 6 x n_layers x seq_len x d_model; "
      f"peak: {r0['peak_source']} = {r0['peak_flops'] / 1e12:.1f} TFLOP/s\n")
print("| size | variant | params | compile | seqs/GPU x seq | step s | tokens/s/GPU | TFLOP/s/GPU | MFU | peak mem GB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['size']} | {r['variant']} | {r['params'] / 1e6:.0f}M | {'yes' if r['compile'] else 'no'} | "
          f"{r['micro_batch']}x{r['shape']['seq_len']} | {r['step_time_s']:.3f} | {r['tokens_per_s']:,.0f} | "
          f"{r['tflops_per_s']:.0f} | {100 * r['mfu']:.1f}% | {r['peak_mem_gb']:.1f} |")
print("\nanchors (ANCHORS.md §2a, H100 bf16): ~1B at ~40% MFU and ~40-45K tokens/s/GPU "
      "(llm-foundry MPT-1B 45,455 at 41.8%, OLMo-1B 44,000)")
EOF

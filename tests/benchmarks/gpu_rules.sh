#!/usr/bin/env bash
# The depth study and every residual rule's cost, on one CUDA GPU, unattended within TIME_LIMIT (8 minutes):
#
#   bash tests/benchmarks/gpu_rules.sh
#
# Part 1, the depth study (DEPTH_TIME seconds): `python -m rrtrain.planning.depth_study run` trains review_convex,
# review, highway_convex and highway at the rr-590m and rr-1b shapes (40 and 48 sublayers), each at the default
# learning rate (configs/train/paper.yaml's) /3, x1 and x3, on the synthetic stories with a BPE vocabulary, the
# convergence monitor stopping runs that stall or diverge; it prints a verdict per (shape, rule, lr), the final
# loss against the unigram entropy and the per-block gradient norms (docs/depth.md, "At the paper's shapes").
# Part 2, the rules' cost (the rest of the time): gpu_matrix.py measures standard, review, deepnorm, gr, hc (static
# and dynamic), mhc and attnres (full and block 4) at rr-1b then rr-150m, compiled, bf16, FSDP2 on one GPU, and
# prints per size step time, tokens/s, MFU and peak memory, each as a multiple of standard's, beside the rule's
# predicted FLOP ratio (docs/performance.md, "Residual rules on a GPU").
# Either part may be left out (DEPTH_SHAPES="" or RULES=""): the other then has all the time (gpu_device.sh runs
# them as two of its parts).
#
# Conventions as gpu.sh's: nothing is installed; the interpreter is PYTHON, else .venv/bin/python when its torch sees
# CUDA, else python3, with this checkout on PYTHONPATH; it needs torch, numpy, pyyaml and tokenizers (not
# streaming, deepspeed or submitit). A run or measurement that fails is reported and the rest go on; what would
# start too late is skipped and listed. Exit status 0 when every planned run and measurement was made, else 1.
#
# Environment (defaults in brackets):
#   DEPTH_SHAPES [rr-590m rr-1b] ("" leaves part 1 out)   DEPTH_RULES [review_convex review highway_convex highway]
#   DEPTH_LR_FACTORS [0.3333333 1 3]   multiples of the default learning rate
#   DEPTH_STEPS [100]   optimizer steps per run (warmup a tenth; monitor window a quarter, from half of them)
#   DEPTH_MICRO [16] DEPTH_SEQ [256]   sequences and tokens per sequence per step
#   DEPTH_TOKENIZER [bpe:4096] DEPTH_DOCS [8000] DEPTH_PRECISION [bf16]
#   DEPTH_TIME [270]    seconds for part 1 when part 2 runs too (each run may spend the time left / the runs left)
#   DEPTH_EXTRA []      more key=value overrides for every depth run (e.g. model.n_layers=10)
#   RULE_SIZES [rr-150m rr-1b]
#   RULES [standard review deepnorm gr hc_static hc_dynamic mhc attnres_full attnres_block_4] ("" leaves part 2 out;
#                       standard@review adds review's matched baseline, and its line against it)
#   RULE_COMPILE [true]   train.compile settings to measure (e.g. "false true")
#   MICRO_<size> (e.g. MICRO_rr_1b), MICRO, STEPS [8], WARMUP [2], EXTRA []   as gpu.sh's, for part 2; MICRO=shared:
#                       the largest micro-batch `auto` chooses for every rule of a size, so their steps compare
#   TIME_LIMIT [480]    seconds for the whole script (at least 120 for both parts, 60 for one)
#   RESULTS_DIR [a temporary directory]   depth.jsonl and rules.jsonl (JSON lines) are kept there
#   ALLOW_CPU [0]       1: run without CUDA (only to test this script on a CPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
START=$SECONDS

die() { echo "gpu_rules.sh: error: $*" >&2; exit 1; }
. tests/benchmarks/gpu_python.sh
gpu_python gpu_rules.sh "torch, yaml, numpy, tokenizers"

DEPTH_SHAPES=${DEPTH_SHAPES-"rr-590m rr-1b"}
DEPTH_RULES=${DEPTH_RULES:-"review_convex review highway_convex highway"}
DEPTH_LR_FACTORS=${DEPTH_LR_FACTORS:-"0.3333333 1 3"}
RULE_SIZES=${RULE_SIZES:-"rr-150m rr-1b"}
RULES=${RULES-"standard review deepnorm gr hc_static hc_dynamic mhc attnres_full attnres_block_4"}
RULE_COMPILE=${RULE_COMPILE:-true}
TIME_LIMIT=${TIME_LIMIT:-480}
[ -n "$DEPTH_SHAPES$RULES" ] || die "DEPTH_SHAPES and RULES are both empty: nothing to run"
[ "$TIME_LIMIT" -ge 60 ] 2>/dev/null || die "TIME_LIMIT must be at least 60 (seconds), got '$TIME_LIMIT'"
if [ -n "$RULES" ] && [ -n "$DEPTH_SHAPES" ]; then
  DEPTH_TIME=${DEPTH_TIME:-270}
  [ "$TIME_LIMIT" -ge 120 ] 2>/dev/null ||
    die "TIME_LIMIT must be at least 120 (seconds) for both parts, got '$TIME_LIMIT'"
  [ "$DEPTH_TIME" -ge 30 ] 2>/dev/null && [ "$DEPTH_TIME" -le $(( TIME_LIMIT - 90 )) ] ||
    die "DEPTH_TIME must be between 30 and TIME_LIMIT - 90 (seconds), got '$DEPTH_TIME'"
fi
DIR=${RESULTS_DIR:-$(mktemp -d -t gpu-rules.XXXXXX)}
mkdir -p "$DIR" || die "cannot create $DIR"
DEPTH_OUT=$DIR/depth.jsonl RULES_OUT=$DIR/rules.jsonl
rm -f "$DEPTH_OUT"; : >"$RULES_OUT"
rc1=0 shown1=0 rc2=0 shown2=0

# -- part 1: the depth study ---------------------------------------------------------------------------------
if [ -n "$DEPTH_SHAPES" ]; then
  [ -n "$RULES" ] || DEPTH_TIME=$(( TIME_LIMIT - (SECONDS - START) ))  # the study alone: all the time left
  depth=(run --out "$DEPTH_OUT" --budget-s $(( DEPTH_TIME - 25 )))
  # shellcheck disable=SC2206  # word lists
  depth+=(--shapes $DEPTH_SHAPES --rules $DEPTH_RULES --lr-factors $DEPTH_LR_FACTORS)
  [ -n "${DEPTH_STEPS:-}" ] && depth+=(--steps "$DEPTH_STEPS")
  [ -n "${DEPTH_MICRO:-}" ] && depth+=(--micro-batch "$DEPTH_MICRO")
  [ -n "${DEPTH_SEQ:-}" ] && depth+=(--seq-len "$DEPTH_SEQ")
  [ -n "${DEPTH_TOKENIZER:-}" ] && depth+=(--tokenizer "$DEPTH_TOKENIZER")
  [ -n "${DEPTH_DOCS:-}" ] && depth+=(--docs "$DEPTH_DOCS")
  [ -n "${DEPTH_PRECISION:-}" ] && depth+=(--precision "$DEPTH_PRECISION")
  for kv in ${DEPTH_EXTRA:-}; do depth+=(--set "$kv"); done
  depth_planned=$(( $(wc -w <<<"$DEPTH_SHAPES") * $(wc -w <<<"$DEPTH_RULES") * $(wc -w <<<"$DEPTH_LR_FACTORS") ))
  echo "gpu_rules.sh: part 1, the depth study: $depth_planned runs in at most ${DEPTH_TIME}s; results in $DEPTH_OUT" >&2
  # the study prints its own table at its end; the one printed below is read back from its results file
  timeout -k 5 $(( DEPTH_TIME - 10 )) "$PY" -m rrtrain.planning.depth_study "${depth[@]}" >"$DIR/depth.out"
  rc1=$?
  if [ "$rc1" = 124 ] || [ "$rc1" = 137 ]; then
    echo "gpu_rules.sh: the depth study was stopped at its time limit" >&2
  fi
fi

# -- part 2: the rules' cost ---------------------------------------------------------------------------------
if [ -n "$RULES" ]; then
  args=(measure --out "$RULES_OUT" --steps "${STEPS:-8}" --warmup "${WARMUP:-2}")
  # shellcheck disable=SC2206  # word lists
  args+=(--sizes $RULE_SIZES --variants $RULES --compile $RULE_COMPILE)
  for size in $RULE_SIZES; do
    var="MICRO_${size//-/_}"
    if [ -n "${!var:-}" ]; then args+=(--micro "$size=${!var}"); fi
  done
  [ -n "${MICRO:-}" ] && args+=(--default-micro "$MICRO")
  for kv in ${EXTRA:-}; do args+=(--set "$kv"); done
  rules_planned=$(( $(wc -w <<<"$RULE_SIZES") * $(wc -w <<<"$RULES") * $(wc -w <<<"$RULE_COMPILE") ))
  left=$(( TIME_LIMIT - (SECONDS - START) ))
  args+=(--budget-s $(( left - 25 )))
  echo "gpu_rules.sh: part 2, the rules' cost: $rules_planned measurements in at most ${left}s;" \
    "results in $RULES_OUT" >&2
  timeout -k 5 $(( left - 10 )) "$PY" tests/benchmarks/gpu_matrix.py "${args[@]}"
  rc2=$?
  if [ "$rc2" = 124 ] || [ "$rc2" = 137 ]; then
    echo "gpu_rules.sh: the rules' cost was stopped at the time limit" >&2
  fi
fi

# -- the tables ----------------------------------------------------------------------------------------------
if [ -n "$DEPTH_SHAPES" ]; then
  echo
  echo "## The depth study"
  echo
  "$PY" -m rrtrain.planning.depth_study render "$DEPTH_OUT" --expect "$depth_planned"
  shown1=$?
fi
if [ -n "$RULES" ]; then
  echo
  echo "## The rules' cost"
  "$PY" tests/benchmarks/gpu_matrix.py render-rules "$RULES_OUT" --expect "$rules_planned"
  shown2=$?
fi
echo "gpu_rules.sh: done in $(( SECONDS - START ))s; results in $DIR" >&2
[ "$rc1" = 0 ] && [ "$shown1" = 0 ] && [ "$rc2" = 0 ] && [ "$shown2" = 0 ]

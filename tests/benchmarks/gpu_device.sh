#!/usr/bin/env bash
# The one script a lent GPU runs (issue 50): unattended within TIME_LIMIT (8 minutes) on one H100 or H200, five
# parts in order of value, each printing its own tables (docs/performance.md, "GPU"):
#
#   bash tests/benchmarks/gpu_device.sh
#
# 1. SIZE (rr-1b) `standard`, bf16, compiled, sequences of SEQ (2048) tokens at train.micro_batch=auto: tokens/s,
#    MFU, peak memory (gpu.sh, one measurement);
# 2. float8 against bf16 at SIZE: tokens/s of each and their ratio, the loss over the last quarter of LOSS_STEPS
#    steps (gpu.sh's pair, FLOAT8_MICRO sequences: 8 of 2048 plan 45 GiB, so they fit an 80 GB GPU);
# 3. every rule's compiled step time and peak memory against `standard` at SIZE (gpu_rules.sh's part 2), every
#    rule at one micro-batch: the largest that `auto` chooses for each of them (MICRO=shared: the GPU's free
#    memory and `rrtrain plan`'s peak per rule), in RULES' order, so what is cut for time is the least wanted;
# 4. the convex and additive gates at DEPTH_SHAPE (rr-590m): verdict, loss against the unigram entropy, gradient
#    norms per block (gpu_rules.sh's part 1, the depth study), DEPTH_STEPS steps per run or as many as the time
#    that remains allows;
# 5. one step of BIG_SIZE (frontier-7b) at `rrtrain plan`'s recommendation for this GPU, its measured peak
#    against the plan's (gpu.sh's large model), if the time that remains allows.
#
# Time: part k may run until the end of its slot (PART_S gives parts 1-3 theirs, one after the other; part 4's and
# part 5's end at TIME_LIMIT), so a part also gets what the parts before it left unused. A part with less time
# than it needs to start (60, 100, 60, 60 and 130 s) is not started; a part that fails or reaches its limit is
# reported and the next one starts. The end lists every part: done, failed, or skipped for time. Each part runs
# in its own processes (a crash or an out-of-memory error stays in it), the interpreter checked once here.
# Exit status: 0 when every part asked for ran and made every measurement, 1 otherwise, 2 for bad input.
#
# Environment (defaults in brackets):
#   TIME_LIMIT [480]    seconds for the whole script
#   PART_S [120 120 160] the slots of parts 1, 2 and 3, in seconds
#   PARTS [1 2 3 4 5]   the parts to run (e.g. "3 4" to rerun two of them: they get the time)
#   SIZE [rr-1b] SEQ [2048]   the shape of parts 1-3
#   COMPILE [true]      train.compile for parts 1-3 and 5 (false only to test this script)
#   MICRO [auto for part 1, shared for part 3]   sequences per GPU of parts 1 and 3 (N: both at N)
#   FLOAT8 [rowwise] FLOAT8_MICRO [8] LOSS_STEPS [60] LOSS_BOUND [0.02]   part 2
#   RULES [standard mhc hc_dynamic attnres_block_4 gr review standard@review attnres_full deepnorm hc_static]
#   DEPTH_SHAPE [rr-590m] DEPTH_RULES [review_convex review] DEPTH_STEPS [300] DEPTH_LR_FACTORS [1]   part 4
#   BIG_SIZE [frontier-7b]   part 5
#   EXTRA []            more key=value overrides for parts 1-3 and 5
#   RESULTS_DIR [a temporary directory]   each part's JSON lines (part1.jsonl ...) are kept there
#   PYTHON, WHEELS, ALLOW_CPU, STEPS, WARMUP, BIG_STEPS, BIG_WARMUP, DEPTH_MICRO, DEPTH_SEQ, DEPTH_TOKENIZER,
#   DEPTH_DOCS, DEPTH_PRECISION, DEPTH_EXTRA: as gpu.sh's and gpu_rules.sh's (STEPS and WARMUP: theirs if unset)
set -uo pipefail
CALLER=$PWD
cd "$(dirname "$0")/../.." || exit 1
START=$SECONDS

bad() { echo "gpu_device.sh: error: $*" >&2; exit 2; }
is_int() { [[ $1 =~ ^[0-9]+$ ]]; }

TIME_LIMIT=${TIME_LIMIT:-480}
PART_S=${PART_S:-"120 120 160"}
PARTS=${PARTS:-"1 2 3 4 5"}
SIZE=${SIZE:-rr-1b}
SEQ=${SEQ:-2048}
COMPILE=${COMPILE:-true}
RULES=${RULES:-"standard mhc hc_dynamic attnres_block_4 gr review standard@review attnres_full deepnorm hc_static"}
BIG_SIZE=${BIG_SIZE:-frontier-7b}
read -r S1 S2 S3 rest <<<"$PART_S"
is_int "$TIME_LIMIT" || bad "TIME_LIMIT must be a number of seconds, got '$TIME_LIMIT'"
is_int "${S1:-}" && is_int "${S2:-}" && is_int "${S3:-}" && [ -z "${rest:-}" ] ||
  bad "PART_S must be three numbers of seconds (parts 1, 2 and 3), got '$PART_S'"
is_int "$SEQ" || bad "SEQ must be a number of tokens, got '$SEQ'"
[[ $COMPILE =~ ^(true|false)$ ]] || bad "COMPILE must be true or false, got '$COMPILE'"
for k in $PARTS; do [[ $k =~ ^[1-5]$ ]] || bad "PARTS must list parts 1 to 5, got '$PARTS'"; done
DIR=${RESULTS_DIR:-$(mktemp -d -t gpu-device.XXXXXX)}
[[ $DIR == /* ]] || DIR=$CALLER/$DIR
(umask 077 && mkdir -p "$DIR" 2>/dev/null) || bad "cannot create RESULTS_DIR '$DIR'"

. tests/benchmarks/gpu_python.sh
gpu_python gpu_device.sh "torch, yaml" float8  # part 4 also needs numpy and tokenizers: it alone fails without
torchao_site gpu_device.sh
export GPU_PY_CHECKED=$PY  # the parts repeat none of these checks (gpu_python.sh)

END=(0 "$S1" $(( S1 + S2 )) $(( S1 + S2 + S3 )) "$TIME_LIMIT" "$TIME_LIMIT")  # each part's slot ends here
NEED=(0 60 100 60 60 130)  # the least time a part is started with: what its script needs to begin measuring
declare -a TITLE STATUS
shape="model.seq_len=$SEQ ${EXTRA:-}"
echo "gpu_device.sh: parts $PARTS in at most ${TIME_LIMIT}s (parts 1-3 end by ${END[1]}, ${END[2]} and" \
  "${END[3]}s); results in $DIR" >&2

part() {  # K TITLE COMMAND...: part K, within the rest of its slot, unless too little of it is left
  local k=$1 now limit t0 rc
  TITLE[$k]=$2
  shift 2
  now=$(( SECONDS - START ))
  limit=$(( (END[k] < TIME_LIMIT ? END[k] : TIME_LIMIT) - now ))
  echo
  echo "# Part ${TITLE[$k]}"
  if [[ " $PARTS " != *" $k "* ]]; then
    STATUS[$k]="not asked (PARTS)"
  elif [ "$limit" -lt "${NEED[k]}" ]; then
    STATUS[$k]="skipped for time: ${limit}s left at ${now}s, it needs ${NEED[k]}s"
  else
    echo "gpu_device.sh: part $k from ${now}s, at most ${limit}s" >&2
    t0=$SECONDS
    timeout -k 5 $(( limit + 10 )) env TIME_LIMIT="$limit" "$@"
    rc=$?
    if [ "$rc" = 0 ]; then
      STATUS[$k]="done in $(( SECONDS - t0 ))s"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      STATUS[$k]="stopped at its limit after $(( SECONDS - t0 ))s"
    else
      STATUS[$k]="not complete (exit $rc) after $(( SECONDS - t0 ))s: see its tables"
    fi
  fi
  echo "gpu_device.sh: part $k: ${STATUS[$k]}"
}

part 1 "1. $SIZE standard, bf16, compiled=$COMPILE, $SEQ tokens per sequence, micro-batch ${MICRO:-auto}" \
  SIZES="$SIZE" VARIANTS=standard COMPILE_MODES="$COMPILE" MICRO="${MICRO:-auto}" FLOAT8_SIZE= BIG_SIZE= \
  EXTRA="$shape" RESULTS="$DIR/part1.jsonl" bash tests/benchmarks/gpu.sh
part 2 "2. float8 (${FLOAT8:-rowwise}) against bf16 at $SIZE, ${FLOAT8_MICRO:-8} x $SEQ tokens" \
  SIZES= FLOAT8_SIZE="$SIZE" FLOAT8="${FLOAT8:-rowwise}" FLOAT8_MICRO="${FLOAT8_MICRO:-8}" \
  FLOAT8_COMPILE="$COMPILE" LOSS_STEPS="${LOSS_STEPS:-60}" BIG_SIZE= EXTRA="$shape" RESULTS="$DIR/part2.jsonl" \
  bash tests/benchmarks/gpu.sh
part 3 "3. every rule against standard at $SIZE, compiled=$COMPILE, micro-batch ${MICRO:-shared}" \
  DEPTH_SHAPES= RULES="$RULES" RULE_SIZES="$SIZE" RULE_COMPILE="$COMPILE" MICRO="${MICRO:-shared}" \
  EXTRA="$shape" RESULTS_DIR="$DIR/part3" bash tests/benchmarks/gpu_rules.sh
part 4 "4. the convex and additive gates at ${DEPTH_SHAPE:-rr-590m}'s shape" \
  RULES= DEPTH_SHAPES="${DEPTH_SHAPE:-rr-590m}" DEPTH_RULES="${DEPTH_RULES:-review_convex review}" \
  DEPTH_STEPS="${DEPTH_STEPS:-300}" DEPTH_LR_FACTORS="${DEPTH_LR_FACTORS:-1}" RESULTS_DIR="$DIR/part4" \
  bash tests/benchmarks/gpu_rules.sh
part 5 "5. one step of $BIG_SIZE at rrtrain plan's recommendation for this GPU" \
  SIZES= FLOAT8_SIZE= BIG_SIZE="$BIG_SIZE" BIG_COMPILE="$COMPILE" EXTRA="${EXTRA:-}" RESULTS="$DIR/part5.jsonl" \
  bash tests/benchmarks/gpu.sh

echo
echo "# Summary: $(( SECONDS - START ))s of ${TIME_LIMIT}s; results in $DIR"
echo
echo "| part | status |"
echo "|---|---|"
status=0 skipped=""
for k in 1 2 3 4 5; do
  echo "| ${TITLE[$k]} | ${STATUS[$k]} |"
  case ${STATUS[$k]} in
    "done in"*|"not asked"*) ;;
    "skipped for time"*) skipped="$skipped $k"; status=1 ;;
    *) status=1 ;;
  esac
done
echo
echo "skipped for time:${skipped:- none}"
exit "$status"

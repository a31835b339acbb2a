# Sourced by gpu.sh and gpu_rules.sh (from the repository root): the Python they run, chosen once.
#   gpu_python NAME MODULES   sets PY ($PYTHON, else .venv's when its torch sees CUDA, else python3), puts the
#                             checkout on PYTHONPATH, and stops unless PY imports MODULES and (without
#                             ALLOW_CPU=1) sees a CUDA device; NAME prefixes the error lines.
has_cuda() { "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }

gpu_python() {
  local name=$1 modules=$2
  if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
  elif [ -x .venv/bin/python ] && has_cuda .venv/bin/python; then
    PY=.venv/bin/python
  else
    PY=python3
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" -c "import $modules" || { echo "$name: error: $PY cannot import $modules" >&2; exit 1; }
  if [ "${ALLOW_CPU:-0}" != 1 ] && ! has_cuda "$PY"; then
    echo "$name: error: torch in $PY sees no CUDA device (set ALLOW_CPU=1 only to test this script)" >&2
    exit 1
  fi
}

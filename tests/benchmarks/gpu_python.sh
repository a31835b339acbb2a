# Sourced by the GPU scripts here (from the repository root): the Python they run, checked once.
#   gpu_python NAME MODULES [float8]   sets PY ($PYTHON, else .venv's when its torch sees CUDA, else python3) and
#                             puts the checkout on PYTHONPATH; then one start of PY imports MODULES, sees a CUDA
#                             device (unless ALLOW_CPU=1) and prints a line on stderr with torch's and torchao's
#                             versions and the GPU (name, memory), or the script stops; NAME prefixes the lines.
#                             With `float8` it also tries torchao.float8 (for torchao_site). Under
#                             gpu_device.sh (GPU_PY_CHECKED: the interpreter it chose and checked) it only sets PY,
#                             and torchao_site does nothing: a part the driver starts repeats none of its checks.
#   torchao_site NAME         when PY cannot import torchao.float8 and WHEELS (.whl) holds a torchao wheel, installs
#                             it into a temporary directory put on PYTHONPATH (no network), and prints the line again.
has_cuda() { "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }

gpu_check() {  # NAME MODULES [float8]: 0, 3 when torchao.float8 (asked for) cannot be imported, 1: stop
  "$PY" - "$1" "$2" "${ALLOW_CPU:-0}" "${3:-}" <<'PYEOF'
import importlib
import importlib.metadata
import sys

name, modules, allow_cpu, float8 = sys.argv[1:]
try:
    for m in modules.split(","):
        importlib.import_module(m.strip())
except ImportError as err:
    sys.exit(f"{name}: error: {sys.executable} cannot import {modules}: {err}")
import torch

n = torch.cuda.device_count()
if not n and allow_cpu != "1":
    sys.exit(f"{name}: error: torch in {sys.executable} sees no CUDA device (set ALLOW_CPU=1 only to test this "
             "script)")
try:
    ao, status = importlib.metadata.version("torchao"), 0
    if float8:
        import torchao.float8  # noqa: F401
except ImportError as err:  # PackageNotFoundError is one
    ao, status = f"not usable ({err})", 3
device = ""
if n:
    p = torch.cuda.get_device_properties(0)
    device = f": {p.name}, {p.total_memory / 2**30:.0f} GiB"
print(f"{name}: {sys.executable}, torch {torch.__version__}, torchao {ao}, {n} CUDA device(s){device}",
      file=sys.stderr)
sys.exit(status)
PYEOF
}

gpu_python() {
  local name=$1 modules=$2 float8=${3:-} rc
  TORCHAO_OK=1
  if [ -n "${GPU_PY_CHECKED:-}" ]; then
    PY=$GPU_PY_CHECKED
    return 0
  fi
  if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
  elif [ -x .venv/bin/python ] && has_cuda .venv/bin/python; then
    PY=.venv/bin/python
  else
    PY=python3
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  gpu_check "$name" "$modules" "$float8"
  rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 3 ] || exit 1
  [ "$rc" = 0 ] || [ -z "$float8" ] || TORCHAO_OK=0
}

torchao_site() {
  local name=$1 wheel site
  [ "$TORCHAO_OK" = 0 ] || return 0
  wheel=$(ls "${WHEELS:-.whl}"/torchao-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || return 0
  site=$(mktemp -d -t rrtrain-site.XXXXXX)
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheel" >&2; then
    export PYTHONPATH="$PYTHONPATH:$site"
    gpu_check "$name" torch float8
  else
    echo "$name: could not install $wheel" >&2
  fi
  return 0
}

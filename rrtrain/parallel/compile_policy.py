"""Whether a run compiles its blocks: `train.compile` is true, false or "auto" (the default).

"auto" compiles where it pays for itself: for runs of at least `AUTO_MIN_STEPS` optimizer steps on a CUDA
device and `AUTO_MIN_STEPS_CPU` on CPU. Compiling costs a fixed time up front (inductor, once per block shape)
and saves a share of every step after it. On CPU (tests/benchmarks/bench_compile.py; docs/performance.md,
"Compile", one thread) a cold compile took 17-35 s of CPU time and a compiled step saved 2-9% for `review` at
tiny and rr-60m, nothing measurable for `standard` at any of those shapes (-7% to +2%: noise) nor for `review`
at ~20M (at two threads `standard` at d 128 saved 11%: the threshold is conservative there). From
10,000 steps on, the compile is at most ~3% of even the tiny model's run, below what a gated rule saves, and
costs `standard` little. Tests and the tiny demo (hundreds of steps) stay eager. On an H200 (docs/performance.md,
"GPU") a compile cost 2-6 s more than eager and saved up to 17% of a 0.05-0.5 s step: it pays for itself
within ~100-1,000 steps, so the CUDA threshold is conservative.

`true` asks for compilation wherever possible. Where compilation is unavailable (Python version, no Triton
for CUDA, no C++ compiler for CPU) the run continues eagerly and says so in one line.

A run that compiles first points torch's compile cache at a directory of the user's own (`private_compile_cache`):
inductor loads pickled graphs and compiled modules from it, and its default, /tmp/torchinductor_USER, is a name
in a shared directory that torch uses without asking who made it. Torch writes that default into
TORCHINDUCTOR_CACHE_DIR itself (importing torch._dynamo, which the first optimizer step does, calls its
cache_dir()), so a value equal to it is torch's, not the user's choice. Every run, compiled or not, points the
variable at the private directory before its first step (`claim_compile_cache`): torch makes its cache
directory at that import, and a file a co-tenant planted at the default name would crash it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Optional, Union

import torch

from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.core.host_locks import private_host_dir

#: shortest runs (optimizer steps) that "auto" compiles, on a GPU and on CPU: see docs/performance.md, "Compile"
AUTO_MIN_STEPS = 1000
AUTO_MIN_STEPS_CPU = 10_000

#: where inductor keeps (and loads) its compiled graphs and, under it, Triton's kernels
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: Triton's own cache, when the user points it elsewhere (unset: inductor keeps Triton's under CACHE_ENV)
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def default_compile_cache(root: Optional[str] = None) -> str:
    """`<root>/rrtrain-<uid>-torchinductor` (root: the temp dir, node-local as torch's own default): the name
    tried first; when another user holds it, `private_host_dir` gives a directory of the user's own instead."""
    return os.path.join(root or tempfile.gettempdir(), f"rrtrain-{os.geteuid()}-torchinductor")


def torch_default_cache() -> Optional[str]:
    """The directory torch uses when TORCHINDUCTOR_CACHE_DIR is unset (/tmp/torchinductor_USER), as torch
    computes it; None when this torch has no such function."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return None
    return os.path.abspath(default_cache_dir())


def users_compile_cache() -> Optional[str]:
    """TORCHINDUCTOR_CACHE_DIR as the user set it, or None: unset, or torch's own default, which torch writes
    into the environment itself the first time it asks for its cache (a shared name, never the user's choice)."""
    value = os.environ.get(CACHE_ENV)
    if not value or os.path.abspath(value) == torch_default_cache():
        return None
    return value


def _own_cache(root: Optional[str]) -> str:
    """The user's private cache directory for this host (`private_host_dir`), made when missing."""
    return private_host_dir(root or tempfile.gettempdir(), os.path.basename(default_compile_cache(root)),
                            what=f"torch's compile cache ({CACHE_ENV} unset)")


def private_compile_cache(root: Optional[str] = None) -> str:
    """Point torch's compile cache at a directory only the user can write, made when missing, before anything
    compiles; returns it. TORCHINDUCTOR_CACHE_DIR (and TRITON_CACHE_DIR) set by the user are honoured but
    checked the same way (`files.prepare_private_dir`): one that someone else could write is refused in one
    line, since what is in it runs as the user."""
    path = users_compile_cache() or _own_cache(root)
    for name, where in ((CACHE_ENV, path), (TRITON_CACHE_ENV, os.environ.get(TRITON_CACHE_ENV))):
        if not where:
            continue
        why = files.prepare_private_dir(where)
        if why is not None:
            raise UsageError(f"train.compile: the compile cache {where} ({name}): {why}: torch loads code from it; "
                             f"set {name} to a directory of yours no one else can write")
    os.environ[CACHE_ENV] = os.path.abspath(path)
    _keep_headers_inside(os.environ[CACHE_ENV])
    return os.environ[CACHE_ENV]


def _keep_headers_inside(path: str) -> None:
    """Inductor precompiles C++ headers for CPU kernels into `default_cache_dir()/precompiled_headers`, a path
    torch fixes at import whatever TORCHINDUCTOR_CACHE_DIR says (torch 2.14: `codecache._HEADER_DIR`): point it
    into `path` too, or, where this torch keeps them elsewhere, turn the precompiled headers off."""
    try:
        from torch._inductor import codecache, config
    except ImportError:
        return
    if isinstance(getattr(codecache, "_HEADER_DIR", None), str) and hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_DIR = os.path.join(path, "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
    else:
        config.cpp_cache_precompile_headers = False


def claim_compile_cache() -> None:
    """Every run, compiled or not, before its first step: unless the user chose TORCHINDUCTOR_CACHE_DIR, point it
    at the user's private directory, since torch makes the directory it names when the first optimizer step
    imports torch._dynamo (a file a co-tenant planted at torch's default name crashes that). Says nothing when
    that directory cannot be had: a run that compiles refuses in one line (`private_compile_cache`)."""
    if users_compile_cache() is not None:
        return
    try:
        path = _own_cache(None)
    except UsageError:
        return
    if files.private_path_problem(path) is None:
        os.environ[CACHE_ENV] = os.path.abspath(path)


def unavailable_reason(device: torch.device) -> Optional[str]:
    """Why torch.compile cannot run here, or None when it can."""
    import torch._dynamo  # already imported by torch.optim, so free here

    if not torch._dynamo.is_dynamo_supported():
        return f"torch.compile does not support Python {sys.version_info.major}.{sys.version_info.minor}"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton is not installed"
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "no C++ compiler on PATH"
    return None


def auto_compiles(device: torch.device, total_steps: int) -> bool:
    """What "auto" asks for: compile runs long enough to repay the compile time on this kind of device."""
    if device.type == "cuda":
        return total_steps >= AUTO_MIN_STEPS
    return device.type == "cpu" and total_steps >= AUTO_MIN_STEPS_CPU


def resolve_compile(setting: Union[bool, str], device: torch.device, total_steps: int,
                    announce: bool = True) -> bool:
    """The `train.compile` setting made definite for this run; prints one line when a request cannot be met."""
    claim_compile_cache()  # before the first step, compiled or not
    if setting == "auto":
        wanted = auto_compiles(device, total_steps)
    else:
        wanted = bool(setting)
    if not wanted:
        return False
    reason = unavailable_reason(device)
    if reason is None:
        private_compile_cache()  # before anything compiles
        return True
    if announce:
        print(f"rrtrain: train.compile: {reason}; running eagerly", flush=True)
    return False

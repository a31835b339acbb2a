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
"""

from __future__ import annotations

import shutil
import sys
from typing import Optional, Union

import torch

#: shortest runs (optimizer steps) that "auto" compiles, on a GPU and on CPU: see docs/performance.md, "Compile"
AUTO_MIN_STEPS = 1000
AUTO_MIN_STEPS_CPU = 10_000


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
    if setting == "auto":
        wanted = auto_compiles(device, total_steps)
    else:
        wanted = bool(setting)
    if not wanted:
        return False
    reason = unavailable_reason(device)
    if reason is None:
        return True
    if announce:
        print(f"rrtrain: train.compile: {reason}; running eagerly", flush=True)
    return False

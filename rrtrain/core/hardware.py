"""Peak FLOP/s of the device, for MFU: a table for GPUs, a measured matmul probe for CPUs."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tables are read by `rrtrain sweep` and `rrtrain plan`, which need no torch to start
    import torch

# Dense (no sparsity) peak TFLOP/s per GPU by dtype, from the vendors' data sheets.
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "tf32": 494.5, "fp32": 66.9},
    "H100": {"bf16": 989.0, "tf32": 494.5, "fp32": 66.9},  # SXM; PCIe is ~756 bf16
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "A10G": {"bf16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "L40S": {"bf16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "V100": {"bf16": 125.0, "tf32": 15.7, "fp32": 15.7},  # no bf16: fp16 tensor-core peak
    "B200": {"bf16": 2250.0, "tf32": 1100.0, "fp32": 80.0},
    "MI300X": {"bf16": 1307.0, "tf32": 653.7, "fp32": 163.4},
}

# Device memory per GPU in GiB, approximately what CUDA reports as total_memory, for `rrtrain plan`.
GPU_MEMORY_GIB: dict[str, float] = {
    "H200": 139.8,  # 141 GB HBM3e
    "H100": 79.1,  # 80 GB HBM3 (SXM)
    "A100": 79.2,  # the 80 GB model
    "A10G": 22.0,
    "L40S": 44.4,
    "L4": 22.0,
    "V100": 31.7,  # the 32 GB model
    "B200": 178.4,  # 192 GB HBM3e, 180 GB usable
    "MI300X": 191.5,
}


def precision_key(precision: str) -> str:
    return {"bf16": "bf16", "fp32_tf32": "tf32", "fp32": "fp32"}[precision]


@functools.lru_cache(maxsize=None)
def cpu_peak_flops(n: int = 512, reps: int = 8) -> float:
    """Measured fp32 matmul FLOP/s of this process's CPU threads (best of `reps`). Every CPU run pays it at
    start: 512^2 measures what 1024^2 does (within a few percent here) for a tenth of the CPU (0.03 s, not 0.3)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s per device, where the number came from)."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, table in GPU_PEAK_TFLOPS.items():
            if key in name:
                return table[precision_key(precision)] * 1e12, f"table:{key}:{precision_key(precision)}"
        return float("nan"), f"unknown GPU '{name}'"
    return cpu_peak_flops(), "cpu matmul probe (fp32, 512^2)"


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory so far: CUDA's max allocated, or the process's max RSS on CPU."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux

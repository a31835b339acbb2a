"""Step time and memory of every residual variant against `standard`, next to what the formulas predict.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_residuals.py
(or `make bench`). Each (size, variant) is measured in a fresh process (`python bench_residuals.py SIZE
VARIANT`), so the peak resident-set figure is that variant's own. Step time is the CPU time
(`time.process_time`) of the fastest fwd+bwd step on one thread: the development CPUs are shared, and CPU
time counts the work done rather than the waiting (wall time is shown too, for reference). Memory is
measured two ways, both CPU-safe:

* saved activations: the bytes of distinct tensor storages autograd keeps for backward during one forward
  (`torch.autograd.graph.saved_tensors_hooks`); exact and independent of the allocator;
* peak RSS growth: `resource.getrusage(RUSAGE_SELF).ru_maxrss` after the timed steps minus before the first
  forward, i.e. activations + gradients + allocator slack (optimizer state excluded: no optimizer step).

Predicted FLOPs: `sizing.flops_per_token` for the matmuls (6 per weight per token) plus 3× each rule's
forward elementwise/coefficient work per token (`rule_fwd_flops` below, from each rule's equations in
docs/residuals.md), which 6N does not see: HC's per-stream projections touch each weight n times, and AttnRes's
depth attention has no weights at all.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rrtrain import residuals, sizing
from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model
from rrtrain.residuals import RuleKnobs
from rrtrain.residuals.attnres import block_size
from rrtrain.residuals.gr import gr_rank

SIZES = {  # name: (model overrides, batch, timed steps); tiny with the byte vocabulary it trains with
    "tiny": (dict(size="tiny", vocab_size=258), 8, 10),
    "20m": (dict(size="tiny", d_model=384, n_layers=8, n_heads=6, d_ff=1536, seq_len=256, vocab_size=8192), 4, 4),
}
PASSES = 3  # measure every variant this many times (interleaved) and keep the fastest step
THREADS = 1  # one thread: its CPU time is the work done, whatever else shares the machine
VARIANTS = {  # label: (rule, residual overrides)
    "standard": ("standard", {}),
    "review": ("review", {}),
    "deepnorm": ("deepnorm", {}),
    "gr": ("gr", {}),
    "hc (static)": ("hc", {"hc_dynamic": False}),
    "hc (dynamic)": ("hc", {}),
    "mhc": ("mhc", {}),
    "attnres (full)": ("attnres", {}),
    "attnres (block 4)": ("attnres", {"attnres_block_size": 4}),
}


def model_config(size: str, label: str) -> ModelConfig:
    over, _, _ = SIZES[size]
    rule, res = VARIANTS[label]
    return ModelConfig(variant=rule, residual=dict(**res), **over)


def knobs(m: ModelConfig) -> RuleKnobs:
    """Every built-in rule's knobs in one namespace, from `m.residual`: the formulas below read any rule's."""
    classes = tuple(dict.fromkeys(k for spec in residuals.BUILTIN for k in spec.knobs))
    return RuleKnobs.of(classes, m.residual)


def attnres_sources(n_sub: int, cfg: RuleKnobs) -> list[int]:
    """How many sources each sublayer attends over (the embedding, closed blocks, the open block)."""
    s = block_size(cfg)
    return [1 + l // s + (1 if l % s else 0) for l in range(n_sub)]


def rule_fwd_flops(rule: str, d: int, n_sub: int, cfg: RuleKnobs) -> float:
    """Forward FLOPs per token a rule adds beyond the standard pre-norm residual, its matmuls included."""
    n = cfg.streams
    if rule == "gr":
        r = gr_rank(d, cfg)
        site = 2 * (2 * n * d * r + n * n * d) + 10 * n * d  # controllers; norm, gates, read, write
        return n_sub * site + 4 * n * d * r + 8 * n * d
    if rule == "hc":
        site = 2 * n * d * (n + 1) + 2 * n * d  # read + mix, write
        if cfg.hc_dynamic:
            site += 2 * n * d * (n + 2) + 4 * n * d  # per-stream projections (each weight used n times), norm
        return n_sub * site + n * d
    if rule == "mhc":
        site = 2 * n * d * (n * n + 2 * n) + 2 * n * d + 2 * n * n * d + 2 * n * d + 3 * n * d
        return n_sub * site + 2 * n * d * n + 2 * n * d
    if rule == "attnres":
        return sum(6 * m * d for m in attnres_sources(n_sub, cfg)) + 6 * (n_sub // 2 + 1) * d
    if rule == "review":
        return 0.0  # its gates are matmul weights: already in 6N
    return 0.0


def flops_ratio(m: ModelConfig) -> float:
    """Predicted training FLOPs per token of `m`'s rule over `standard`'s at the same shape (also gpu_matrix.py's)."""
    shape = sizing.resolve_shape(m)
    base = sizing.flops_per_token(shape, "standard", m.residual)
    flops = sizing.flops_per_token(shape, m.variant, m.residual)
    if m.variant in ("gr", "hc", "mhc", "attnres"):  # their weights are counted in rule_fwd_flops instead
        flops -= 6 * sizing.gate_params(shape, m.variant, m.residual)
    flops += 3 * rule_fwd_flops(m.variant, shape.d_model, shape.n_sublayers, knobs(m))
    return flops / base


def predicted(size: str, label: str) -> dict:
    m = model_config(size, label)
    shape = sizing.resolve_shape(m)
    streams = knobs(m).streams
    state = {"gr": streams, "hc": streams, "mhc": streams}.get(m.variant, 1)
    if m.variant == "attnres":
        state = max(attnres_sources(shape.n_sublayers, knobs(m))) + 1
    return {"flops_ratio": flops_ratio(m), "state_per_token_d": state,
            "params": sizing.count_params(shape, m.variant, m.residual)}


def saved_activation_bytes(model: torch.nn.Module, idx: torch.Tensor) -> int:
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(idx, idx)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(b for ptr, b in storages.items() if ptr not in params)


def measure(size: str, label: str) -> dict:
    """One (size, variant): fastest fwd+bwd step in CPU time and wall time, saved activations, peak RSS growth."""
    torch.manual_seed(0)
    m = model_config(size, label)
    model = build_model(m)
    _, batch, steps = SIZES[size]
    shape = sizing.resolve_shape(m)
    idx = torch.randint(0, shape.vocab_size, (batch, shape.seq_len))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    saved = saved_activation_bytes(model, idx)  # also the warm-up step
    wall, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        model(idx, idx).backward()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        model.zero_grad(set_to_none=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    return {"step_s": min(cpu), "wall_s": min(wall), "saved_mb": saved / 2**20, "rss_mb": rss / 1024,
            "tokens": batch * shape.seq_len}


def run_one(size: str, label: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    out = subprocess.run([sys.executable, __file__, size, label], capture_output=True, text=True, env=env,
                         check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(size: str) -> str:
    rows = {label: {**predicted(size, label), **run_one(size, label)} for label in VARIANTS}
    for _ in range(PASSES - 1):
        for label in VARIANTS:
            again = run_one(size, label)
            rows[label]["step_s"] = min(rows[label]["step_s"], again["step_s"])
            rows[label]["wall_s"] = min(rows[label]["wall_s"], again["wall_s"])
    ref = rows["standard"]
    m = model_config(size, "standard")
    shape = sizing.resolve_shape(m)
    lines = [f"### {size}: d_model={shape.d_model}, blocks={shape.n_layers}, vocab={shape.vocab_size}, "
             f"seq={shape.seq_len}, batch={SIZES[size][1]}, streams n={knobs(m).streams}",
             "",
             "| variant | params | FLOPs/token predicted | CPU time/step | measured | (wall) | state/token "
             "predicted | saved activations | measured | peak RSS growth |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in rows.items():
        lines.append(
            f"| {label} | {r['params']:,} | {r['flops_ratio']:.3f}× | {1000 * r['step_s']:.0f} ms | "
            f"{r['step_s'] / ref['step_s']:.2f}× | {r['wall_s'] / ref['wall_s']:.2f}× | {r['state_per_token_d']}·d | "
            f"{r['saved_mb']:.1f} MB | "
            f"{r['saved_mb'] / ref['saved_mb']:.2f}× | {r['rss_mb']:.0f} MB |")
    return "\n".join(lines)


@pytest.mark.parametrize("size", list(SIZES))
def test_bench_residual_variants(size):
    text = table(size)
    print("\n" + text + "\n")
    out = Path(os.environ.get("RRTRAIN_BENCH_OUT", "runs/bench"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"residuals_{size}.md").write_text(text + "\n")


if __name__ == "__main__":
    torch.set_num_threads(THREADS)
    print(json.dumps(measure(sys.argv[1], sys.argv[2])))

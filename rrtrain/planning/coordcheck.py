"""The coordinate check (microsoft/mup's README; nanoGPT-mup's coord-check examples): train each shape a few
steps at a deliberately large learning rate and watch the scale of the activations against the width or the
depth. Under a parametrization that transfers, the curves are flat; under sp they grow (or shrink) with the size.

For each shape (a width: `model.d_model`, or a depth: `model.n_layers` blocks), each seed and each step 0..N
(step 0: at initialisation), one fixed probe batch goes forward and these are recorded:

    h_abs          per block: mean |h| of the residual state the block writes (every tensor of the state: the n
                   streams of a multi-stream rule, AttnRes's sources, ...)
    h_delta        per block: mean |h_t - h_0|, against the same block's state at step 0
    attn_logits    per block: mean |q.k| x the attention's scale over the causal pairs
    output_logits  the LM head's logits, mean |z| (layer = n_layers)
    logits_delta   mean |z_t - z_0| (layer = n_layers)
    gate_mean      per sublayer (layer = its index over the model): the gate's mean, for a rule that records one

Training is in process, eager, on one device (`Plan.device`, the CPU by default), fp32: the model as
`rrtrain.resolve` builds it, AdamW with the run's own parameter groups (`rrtrain.parallel.adamw.build_optimizer`,
so the per-group learning rates, eps and weight decay of mup/completep are those a run uses), a constant learning
rate, no clipping. The data: the built-in
synthetic stories, byte-level and packed in memory (rrtrain/planning/depth_data.py), or `data.path`'s
validation rows when the config names a prepared dataset.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, Iterable, Optional

import torch

from rrtrain.config import Config, load_config
from rrtrain.core.errors import UsageError
from rrtrain.core.io import atomic_path, atomic_write_json
from rrtrain.core.dist import DistInfo
from rrtrain.parallel.build import build_engine
from rrtrain.resolve import check_model, model_spec
from rrtrain.training.step import optimizer_step

QUANTITIES = ("h_abs", "h_delta", "attn_logits", "output_logits", "logits_delta", "gate_mean")


@dataclasses.dataclass(frozen=True)
class Plan:
    parametrization: str
    axis: str  # "width" or "depth"
    sizes: tuple[int, ...]
    steps: int
    seeds: int
    lr: Optional[float] = None  # None: the config's train.lr
    batch: int = 4
    seq_len: int = 32
    docs: int = 40  # synthetic stories: ~600 rows of 33 bytes, plenty for a few steps of a few rows
    device: str = "cpu"  # where each shape trains ("cuda": tests/benchmarks/gpu_coordcheck.sh)


def parse_sizes(text: str, what: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--{what} takes comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--{what} needs at least one size of 1 or more, got {text!r}")
    return sizes


@functools.lru_cache(maxsize=4)
def story_tokens(docs: int, seq_len: int) -> tuple[torch.Tensor, int]:
    """Packed rows (n, seq_len + 1) of the built-in synthetic stories, byte-level, and the vocabulary size."""
    from rrtrain.planning.depth_data import story_rows

    rows = story_rows(docs, "byte", seq_len, 1)
    return torch.as_tensor(rows.train, dtype=torch.long), rows.vocab_size


def dataset_tokens(cfg: Config, rows: int, seq_len: int) -> tuple[torch.Tensor, int]:
    """`rows` validation rows of `data.path` (a prepared dataset), cut to seq_len + 1 tokens."""
    import tempfile

    from rrtrain.data.loader import eval_batches
    from rrtrain.data.manifest import read_manifest

    manifest = read_manifest(cfg.data.path)
    with tempfile.TemporaryDirectory() as cache:
        batches = eval_batches(cfg.data.path, micro_batch=rows, n_batches=1, rank=0, world_size=1, cache_dir=cache,
                               manifest=manifest)
    data = batches[0].long()
    if data.shape[1] < seq_len + 1:
        raise UsageError(f"data.path's rows hold {data.shape[1]} tokens; --seq-len {seq_len} needs {seq_len + 1}")
    return data[:, :seq_len + 1], int(manifest["vocab_size"])


def shape_config(cfg: Config, plan: Plan, size: int) -> Config:
    """The config of one shape: the parametrization, the width (d_ff 4 d) or the depth, the sequence length."""
    m = dataclasses.replace(cfg.model, parametrization=plan.parametrization, seq_len=plan.seq_len)
    if plan.axis == "width":
        m = dataclasses.replace(m, d_model=size, d_ff=4 * size)
    else:
        m = dataclasses.replace(m, n_layers=size)
    return dataclasses.replace(cfg, model=m)


def state_tensors(state: Any) -> list[torch.Tensor]:
    """The residual state's distinct tensors (B, T, ..., D): a tensor, or those inside a tuple (a view of another
    tensor of the state counts once)."""
    found: list[torch.Tensor] = []

    def walk(x: Any) -> None:
        if torch.is_tensor(x):
            if x.dim() >= 3 and x.is_floating_point():
                found.append(x)
        elif isinstance(x, (tuple, list)):
            for item in x:
                walk(item)

    walk(state)
    out, seen = [], set()
    for t in found:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            out.append(t.detach().float())
    return out


def probe(model: Any, idx: torch.Tensor) -> dict[str, Any]:
    """One forward of `idx` with every site recording: per block its state and attention logits, the logits, the
    gates' means. The attention logits are taken from the q and k its `attend_qkv` receives, whoever projected them
    (a site that feeds attention its own q, k, v never calls the QKV module)."""
    blocks, attn, hooks = {}, {}, []
    for i, block in enumerate(model.blocks):
        hooks.append(block.register_forward_hook(lambda mod, args, out, i=i: blocks.__setitem__(i, state_tensors(out))))
        att = block.attn
        plain = att.attend_qkv

        def attend_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any, i: int = i, att: Any = att,
                       plain: Any = plain) -> torch.Tensor:
            b, t, _ = q.shape
            qh, kh = (z.view(b, t, att.n_heads, -1).transpose(1, 2) for z in (q, k))
            if att.rotary is not None:
                qh, kh = att.rotary(qh), att.rotary(kh)
            scale = att.scale if att.scale is not None else qh.shape[-1] ** -0.5
            logits = (qh @ kh.transpose(-1, -2)).float() * scale  # (B, H, T, T)
            causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            attn[i] = float(logits.abs()[..., causal].mean())
            return plain(q, k, v, *rest)

        att.attend_qkv = attend_qkv  # this instance only, until the forward is done
    sites = model.sites()
    for s in sites:
        s.record = True
    try:
        with torch.no_grad():
            logits = model(idx).float()
    finally:
        for h in hooks:
            h.remove()
        for block in model.blocks:
            del block.attn.attend_qkv  # the class's method again
        for s in sites:
            s.record = False
    gates = {k: float(s.stats["gate_mean"]) for k, s in enumerate(sites) if "gate_mean" in s.stats}
    for s in sites:
        s.stats = {}
    return {"blocks": blocks, "attn": attn, "logits": logits, "gates": gates}


def mean_abs(tensors: Iterable[torch.Tensor]) -> float:
    tensors = list(tensors)
    return float(sum(t.abs().sum() for t in tensors) / sum(t.numel() for t in tensors))


def measure_shape(cfg: Config, plan: Plan, size: int, seed: int, data: torch.Tensor, vocab: int) -> list[dict]:
    """Train one shape `plan.steps` steps from seed `seed`; the records of every step (see the module's doc)."""
    from rrtrain.model.transformer import build_model

    scfg = shape_config(cfg, plan, size)
    check_model(scfg)
    spec = model_spec(scfg.model, vocab)
    torch.manual_seed(seed)
    model = build_model(spec, seed=seed)  # drawn on the CPU, so every device starts from the same weights
    info = DistInfo(0, 1, 0, torch.device(plan.device))  # one process: the trainer's engine and step, unsharded
    # eager: a few steps never repay a compile (and train.compile's "auto" is only made definite by the trainer)
    local = dataclasses.replace(scfg, parallel=dataclasses.replace(scfg.parallel, backend="none"),
                                train=dataclasses.replace(scfg.train, compile=False))
    engine = build_engine(model, local, info)
    lr = plan.lr if plan.lr is not None else scfg.train.lr
    gen = torch.Generator().manual_seed(seed)
    probe_rows = data[torch.randint(0, len(data), (plan.batch,), generator=gen)].to(info.device)
    width, depth = spec.shape.d_model, spec.shape.n_layers
    base = {"parametrization": plan.parametrization, "width": width, "depth": depth, "seed": seed}
    records: list[dict] = []
    first: dict[str, Any] = {}
    for step in range(plan.steps + 1):
        if step > 0:
            rows = data[torch.randint(0, len(data), (plan.batch,), generator=gen)]
            optimizer_step(engine, iter([rows]), 1, lr, 0.0, info)  # the trainer's step, unclipped
        seen = probe(model, probe_rows[:, :-1])
        if step == 0:
            first = seen

        def add(layer: int, quantity: str, value: float) -> None:
            records.append({**base, "step": step, "layer": layer, "quantity": quantity,
                            "value": value if math.isfinite(value) else None})

        for i, tensors in sorted(seen["blocks"].items()):
            add(i, "h_abs", mean_abs(tensors))
            add(i, "h_delta", mean_abs(a - b for a, b in zip(tensors, first["blocks"][i])))
            add(i, "attn_logits", seen["attn"][i])
        add(depth, "output_logits", mean_abs([seen["logits"]]))
        add(depth, "logits_delta", mean_abs([seen["logits"] - first["logits"]]))
        for k, g in sorted(seen["gates"].items()):
            add(k, "gate_mean", g)
    return records


def run(cfg: Config, plan: Plan) -> list[dict]:
    """Every (size, seed) of `plan`, in that order."""
    if cfg.data.path:
        data, vocab = dataset_tokens(cfg, max(64, 4 * plan.batch), plan.seq_len)
    else:
        data, vocab = story_tokens(max(plan.docs, plan.seq_len // 4), plan.seq_len)  # longer rows: more stories
    records = []
    for size in plan.sizes:
        for s in range(plan.seeds):
            records.extend(measure_shape(cfg, plan, size, cfg.train.seed + s, data, vocab))
    return records


def last_layer_series(records: list[dict], quantity: str, axis: str) -> dict[int, dict[int, float]]:
    """step -> size -> the value at the shape's last layer (the mean over gates for gate_mean), mean over seeds."""
    acc: dict[tuple[int, int], list[float]] = {}
    last: dict[tuple[int, int, int], int] = {}
    rows = [r for r in records if r["quantity"] == quantity and r["value"] is not None]
    for r in rows:
        key = (r["width"], r["depth"], r["seed"])
        last[key] = max(last.get(key, -1), r["layer"])
    for r in rows:
        if quantity != "gate_mean" and r["layer"] != last[(r["width"], r["depth"], r["seed"])]:
            continue
        acc.setdefault((r["step"], r[axis]), []).append(r["value"])
    out: dict[int, dict[int, float]] = {}
    for (step, size), values in sorted(acc.items()):
        out.setdefault(step, {})[size] = sum(values) / len(values)
    return out


def log_slope(points: dict[int, float]) -> Optional[float]:
    """Least-squares slope of log(value) against log2(size): the change in log per doubling of the width or depth
    (flat: near 0). None for fewer than two sizes or a value that is not positive."""
    xs = sorted(points)
    if len(xs) < 2 or any(not points[x] > 0 for x in xs):
        return None
    lx, ly = [math.log2(x) for x in xs], [math.log(points[x]) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def delta_summary(records: list[dict], plan: Plan) -> dict[str, Any]:
    """The check's headline: the last block's mean |h_t - h_0| after the last step per size (mean over seeds), and
    its change in log per doubling."""
    points = last_layer_series(records, "h_delta", plan.axis).get(plan.steps, {})
    return {"quantity": "h_delta", "step": plan.steps, "values": points, "slope_per_doubling": log_slope(points)}


def plot(records: list[dict], plan: Plan, out: Path) -> list[str]:
    """One PNG per quantity recorded: the last layer's value against the width or depth, a line per step."""
    from rrtrain.core.figures import default_style

    with default_style():
        return _plot(records, plan, out)


def _plot(records: list[dict], plan: Plan, out: Path) -> list[str]:
    from rrtrain.core.figures import Figure

    written = []
    for quantity in QUANTITIES:
        series = last_layer_series(records, quantity, plan.axis)
        if not series:
            continue
        fig = Figure(figsize=(5.5, 4))
        ax = fig.add_subplot(1, 1, 1)
        for step, points in series.items():
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], marker="o", label=f"step {step}")
        ax.set_xscale("log", base=2)
        if quantity != "gate_mean" and all(v > 0 for p in series.values() for v in p.values()):
            ax.set_yscale("log")
        ax.set_xlabel("d_model" if plan.axis == "width" else "blocks")
        ax.set_ylabel(quantity + (" (mean over gates)" if quantity == "gate_mean" else " (last layer)"))
        ax.set_title(f"coordinate check: {plan.parametrization}, {quantity}")
        ax.legend(fontsize="small")
        path = out / f"{quantity}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        written.append(path.name)
    return written


def coordcheck(config: Optional[str], overrides: list[str], plan: Plan, out: Path) -> dict[str, Any]:
    """Run the check and write out/coordcheck.json and the plots; returns a summary."""
    cfg = load_config(config, overrides)
    check_model(shape_config(cfg, plan, plan.sizes[0]))  # a refused rule: one line before any work
    records = run(cfg, plan)
    from rrtrain.core import files

    files.make_dirs(out)
    atomic_write_json(out / "coordcheck.json", records)
    return {"records": len(records), "plots": plot(records, plan, out), "h_delta": delta_summary(records, plan)}

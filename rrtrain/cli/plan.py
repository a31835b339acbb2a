"""`rrtrain plan`: memory per GPU, communication and time for a run, and which settings fit, before spending it.

`rrtrain plan --size S --gpus N ...` plans one run; `rrtrain plan SWEEP.yaml` plans every run of a sweep
(expanded by `launchers.sweep.expand`, exactly as `rrtrain sweep` would submit it) and sums the GPU-hours.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from rrtrain.config import DEFAULT_GPU, DEFAULT_MFU, ModelConfig
from rrtrain.config_load import apply_overrides, build
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain import sizing
from rrtrain.parallel import memory as planner

GIB = 2**30


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _tokens(text: str) -> float:
    """A token count: 2e12, 300B, 1.5T, 40M."""
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    t = text.strip().upper()
    try:
        return float(t[:-1]) * scale[t[-1]] if t and t[-1] in scale else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count such as 2e12 or 300B, got '{text}'") from None


def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain plan", description=__doc__)
    p.add_argument("sweep", nargs="?", default=None, metavar="SWEEP.yaml", help="plan every run of a sweep file")
    p.add_argument("--size", help="a preset: " + ", ".join(sizing.presets()))
    p.add_argument("--gpus", type=_positive_int, help="GPUs in the job")
    p.add_argument("--gpu", default=None, help=f"h100, h200, a100, b200, ... (default {DEFAULT_GPU}, or the sweep's gpu)")
    p.add_argument("--backend", default="fsdp", help="fsdp (default), deepspeed or none (one GPU)")
    p.add_argument("--dp-shard", type=_positive_int, default=None,
                   help="FSDP shard group size, as parallel.dp_shard (default: all GPUs; fewer: HSDP)")
    p.add_argument("--zero-stage", type=int, default=2, help="DeepSpeed ZeRO stage (default 2)")
    p.add_argument("--ac", default="none", help="activation checkpointing: none (default), selective, full")
    p.add_argument("--ac-every", type=_positive_int, default=2, help="selective AC: every k-th block (default 2)")
    p.add_argument("--micro-batch", type=_positive_int, default=1, help="sequences per GPU per pass (default 1)")
    p.add_argument("--global-batch", type=_positive_int, default=None,
                   help="sequences per optimizer step (default: micro-batch x GPUs)")
    p.add_argument("--seq-len", type=_positive_int, default=None, help="sequence length (default: the preset's)")
    p.add_argument("--tokens", type=_tokens, default=None, help="token budget, e.g. 2e12 or 140B")
    p.add_argument("--mfu", type=float, default=None, help=f"model FLOPs utilisation to assume (default "
                   f"{DEFAULT_MFU:.2f}, or the sweep's mfu)")
    p.add_argument("--variant", default="standard", help="residual rule (default standard)")
    p.add_argument("--precision", default="bf16", help="bf16 (default), fp32_tf32 or fp32 (as parallel.precision)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="model overrides, e.g. --set residual.streams=4 --set vocab_size=32000")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p.parse_args(argv)


def setup_from(args: argparse.Namespace) -> planner.Setup:
    overrides = [f"{kv}" for kv in args.set] + [f"size={args.size}", f"variant={args.variant}"]
    if args.seq_len is not None:
        overrides.append(f"seq_len={args.seq_len}")
    model: ModelConfig = build(ModelConfig, apply_overrides({}, overrides), prefix="model")
    return planner.Setup(model=model, gpus=args.gpus, gpu=args.gpu or DEFAULT_GPU, backend=args.backend,
                         dp_shard=args.dp_shard, zero_stage=args.zero_stage, ac=args.ac, ac_every=args.ac_every,
                         micro_batch=args.micro_batch, global_batch=args.global_batch, tokens=args.tokens,
                         mfu=args.mfu if args.mfu is not None else DEFAULT_MFU, precision=args.precision)


def sweep_setups(path: str, gpu: Optional[str], mfu: Optional[float]) -> list[tuple[str, planner.Setup]]:
    """Every run of a sweep as the trainer will see it: resolved config, matched shape, the run's GPUs.

    The vocabulary and sequence length come from the prepared dataset when it exists, else from the config
    (or the sweep's own `prep`): `launchers.sweep.expand` resolved each run so, once.
    """
    from launchers.sweep import spec as sweep_spec
    from launchers.sweep.expand import data_path, expand

    sweep = sweep_spec.load(path)
    out = Path(sweep.spec.out).expanduser() if sweep.spec.out else Path(path).resolve().parent / sweep.spec.name
    if not out.is_absolute():
        out = sweep.path.parent / out
    gpu = gpu or sweep.spec.gpu
    mfu = mfu if mfu is not None else sweep.spec.mfu
    setups = []
    for run in expand(sweep, out, data_path(sweep, out)):
        resolved = run.resolved
        t = resolved.cfg.train
        gpus = run.resources.world_size
        setup = planner.Setup.of_run(resolved, gpus, micro_batch=1 if t.micro_batch == "auto" else t.micro_batch,
                                     backend=None if gpus > 1 else "none", tokens=resolved.tokens, gpu=gpu, mfu=mfu)
        if t.micro_batch == "auto":  # as the trainer will choose it, with the GPU's usable memory as the free figure
            setup = auto_setup(setup)
        setups.append((run.id, setup))
    return setups


def auto_setup(s: planner.Setup) -> planner.Setup:
    """`train.micro_batch: auto` planned: the micro-batch the trainer would pick on an empty GPU of this kind
    (rrtrain.parallel.auto_batch), or 1 when none fits (the plan then says it does not fit)."""
    from rrtrain.parallel.auto_batch import pick_micro_batch

    capacity = planner.gpu_spec(s.gpu, s.precision)[1]
    m = pick_micro_batch(s.batch // s.gpus, lambda mb: planner.plan(dataclasses.replace(s, micro_batch=mb)).total(),
                         int(capacity * (1.0 - planner.HEADROOM)))
    return dataclasses.replace(s, micro_batch=m or 1)


def to_json(p: planner.Plan, fits: list[planner.Plan]) -> dict[str, Any]:
    s = p.setup
    return {
        "size": s.model.size, "variant": s.model.variant, "params": p.params,
        "shape": {"d_model": p.shape.d_model, "n_layers": p.shape.n_layers, "n_heads": p.shape.n_heads,
                  "d_ff": p.shape.d_ff, "seq_len": p.shape.seq_len, "vocab_size": p.shape.vocab_size},
        "gpus": s.gpus, "gpu": s.gpu.lower(), "backend": s.backend, "dp_shard": s.shard, "zero_stage": s.zero_stage,
        "precision": s.precision, "ac": s.ac, "micro_batch": s.micro_batch, "global_batch": s.batch,
        "accum": s.accum,
        "memory_bytes": {
            "state": [{"what": i.what, "dtype": i.dtype, "bytes": i.bytes} for i in p.state],
            "transient": [{"what": i.what, "dtype": i.dtype, "bytes": i.bytes} for i in p.transient],
            "activations": p.activations, "peak": p.total(), "capacity": p.capacity, "usable": p.usable,
        },
        "fits": p.fits,
        "comm_bytes_per_step": p.comm_bytes, "flops_per_token": p.flops_per_token,
        "tokens_per_step": p.tokens_per_step, "tokens": s.tokens, "mfu": s.mfu,
        "time_s": p.time_s, "gpu_hours": p.gpu_hours,
        "fitting_settings": [{"ac": f.setup.ac, "micro_batch": f.setup.micro_batch, "peak_bytes": f.total()}
                             for f in fits],
        "recommended": ({"ac": best.setup.ac, "micro_batch": best.setup.micro_batch, "peak_bytes": best.total()}
                        if (best := planner.recommended(fits)) is not None else None),
        "warnings": list(p.warnings),
    }


def _gib(n: float) -> str:
    return f"{n / GIB:10.2f}"


def render(p: planner.Plan, fits: list[planner.Plan]) -> str:
    s, sh = p.setup, p.shape
    par = {"fsdp": f"fsdp, shard over {s.shard}" + (f" x replicate {s.gpus // s.shard}" if s.shard < s.gpus else ""),
           "deepspeed": f"deepspeed ZeRO-{s.zero_stage}", "none": "one process"}[s.backend]
    lines = [
        f"{s.model.size} {s.model.variant}: {p.params:,} parameters (d_model {sh.d_model}, {sh.n_layers} blocks, "
        f"d_ff {sh.d_ff}, seq {sh.seq_len}, vocab {sh.vocab_size})",
        f"{s.gpus} x {s.gpu.upper()} ({p.capacity / GIB:.1f} GiB), {par}, {s.precision}, AC {s.ac}, "
        f"micro-batch {s.micro_batch}, global batch {s.batch} (accumulation {s.accum})",
        "",
        f"{'memory per GPU':<66}{'dtype':>6}{'GiB':>10}",
    ]
    for item in (*p.state, *p.transient):
        lines.append(f"  {item.what:<64}{item.dtype:>6}{_gib(item.bytes)}")
    cdt = s.precision if s.backend != "none" else "mixed"
    for mode in planner.AC_MODES:
        mark = "  <-" if mode == s.ac else ""
        lines.append(f"  {'activations, AC ' + mode + f' (micro-batch {s.micro_batch})':<64}{cdt:>6}"
                     f"{_gib(p.activations[mode])}{mark}")
    verdict = "fits" if p.fits else "DOES NOT FIT"
    lines += [f"  {'peak (gradients and activations do not coincide)':<70}{_gib(p.total())}",
              f"  {'usable: GPU memory less ' + f'{planner.HEADROOM:.0%} headroom':<70}{_gib(p.usable)}   {verdict}",
              "",
              f"communication per step per GPU: {p.comm_bytes / GIB:.2f} GiB",
              f"FLOPs per token: {p.flops_per_token:.3e} (6N + 12LTD, PaLM's count); "
              f"tokens per step: {p.tokens_per_step:,}"]
    if p.time_s is not None:
        peak, _ = planner.gpu_spec(s.gpu)
        lines.append(f"time for {s.tokens:.3g} tokens at {s.mfu:.0%} MFU of {peak / 1e12:.0f} TFLOP/s"
                     + (" (+ recompute)" if s.ac != "none" else "")
                     + f": {p.time_s / 3600:,.1f} h ({p.time_s / 86400:,.2f} days), {p.gpu_hours:,.0f} GPU-hours")
    lines.append("")
    if fits:
        lines.append("settings that fit (AC, micro-batch: peak GiB):")
        lines.append("  " + ", ".join(f"{f.setup.ac} x{f.setup.micro_batch}: {f.total() / GIB:.1f}" for f in fits))
        best = planner.recommended(fits)
        lines.append(f"recommended (least recomputation, then the largest micro-batch): AC {best.setup.ac}, "
                     f"micro-batch {best.setup.micro_batch} ({best.total() / GIB:.1f} GiB)")
    else:
        lines.append("no AC mode and micro-batch fits: add GPUs, shard over more of them, or use a larger GPU")
    lines += [f"warning: {w}" for w in p.warnings]
    return "\n".join(lines)


def point_of(p: planner.Plan) -> dict[str, Any]:
    """The grid point of a sweep's run ({} without a grid): its resolved config's `run.point`."""
    r = p.setup.run
    return dict(r.cfg.run.point) if r is not None else {}


def grid_lines(plans: list[tuple[str, planner.Plan]]) -> list[str]:
    """Per (size, variant) of a sweep with a grid: its points, runs and GPU-hours."""
    groups: dict[tuple[str, str], list[planner.Plan]] = {}
    for _, p in plans:
        if point_of(p):
            groups.setdefault((p.setup.model.size, p.setup.model.variant), []).append(p)
    out = []
    for (size, variant), members in groups.items():
        npoints = len({tuple(sorted(point_of(p).items())) for p in members})
        out.append(f"grid {size} {variant}: {npoints} points, {len(members)} runs, "
                   f"{sum(p.gpu_hours or 0 for p in members):,.1f} GPU-hours")
    return out


def render_sweep(plans: list[tuple[str, planner.Plan]]) -> str:
    width = max([32] + [len(rid) + 1 for rid, _ in plans])
    lines = [f"{'run':<{width}}{'params':>16}{'GPUs':>6}{'GPU':>6}{'peak GiB':>10}{'of GiB':>8}{'fits':>6}"
             f"{'tokens':>12}{'GPU-hours':>11}"]
    for rid, p in plans:
        s = p.setup
        lines.append(f"{rid:<{width}}{p.params:>16,}{s.gpus:>6}{s.gpu.upper():>6}{p.total() / GIB:>10.2f}"
                     f"{p.usable / GIB:>8.1f}{'yes' if p.fits else 'NO':>6}{(s.tokens or 0):>12.3g}"
                     f"{(p.gpu_hours or 0):>11,.1f}")
    total = sum(p.gpu_hours or 0 for _, p in plans)
    lines += grid_lines(plans)
    worst = max(plans, key=lambda rp: rp[1].total() / rp[1].usable)
    lines += ["", f"{len(plans)} runs: {total:,.1f} GPU-hours in all; largest peak {worst[1].total() / GIB:.2f} GiB "
                  f"per GPU ({worst[0]}); " + ("every run fits" if all(p.fits for _, p in plans)
                                              else f"{sum(not p.fits for _, p in plans)} do NOT fit")]
    for rid, p in plans:
        lines += [f"warning: {rid}: {w}" for w in p.warnings]
    return "\n".join(lines)


def main_sweep(args: argparse.Namespace) -> int:
    single = [flag for flag, value in (("--size", args.size), ("--gpus", args.gpus)) if value is not None]
    if single:
        raise UsageError(f"{single[0]} plans one run; a sweep file sets every run's size and GPUs")
    plans = [(rid, planner.plan(s)) for rid, s in sweep_setups(args.sweep, args.gpu, args.mfu)]
    if args.json:
        runs = {rid: {**to_json(p, []), "point": point_of(p)} for rid, p in plans}
        print(json.dumps({"runs": runs, "gpu_hours": sum(p.gpu_hours or 0 for _, p in plans),
                          "all_fit": all(p.fits for _, p in plans)}, indent=2))
    else:
        print(render_sweep(plans))
    return 0


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.sweep is not None:
        return main_sweep(args)
    for flag, value in (("--size", args.size), ("--gpus", args.gpus)):
        if value is None:
            raise UsageError(f"the following arguments are required: {flag} (or give a sweep file)")
    setup = setup_from(args)
    result = planner.plan(setup)
    fits = planner.fitting(setup)
    if args.json:
        print(json.dumps(to_json(result, fits), indent=2))
    else:
        print(render(result, fits))
    return 0

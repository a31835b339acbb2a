"""`rrtrain coordcheck CONFIG [key=value ...] --parametrization P --widths W1,W2,... | --depths L1,L2,...
--steps N --seeds S --out DIR`: the coordinate check of a parametrization (docs/transfer.md).

Each shape (CONFIG's model at each width, d_ff = 4 d, or each depth in blocks) trains N steps in process at the
config's train.lr (or --lr: make it large) on the built-in synthetic stories (or data.path); per (shape, seed,
step, layer) it records mean |h|, mean |h_t - h_0|, the attention logits, the output logits and each gate's mean
(rrtrain/planning/coordcheck.py) into DIR/coordcheck.json, and draws one PNG per quantity. It prints the last
block's mean |h_t - h_0| after the last step per size and its change in log per doubling (flat: near 0). A rule
the parametrization refuses is refused in one line (exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError


def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain coordcheck", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="a run config (YAML); '-' for the defaults")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. model.variant=review")
    p.add_argument("--parametrization", required=True, choices=["sp", "mup", "completep"])
    sizes = p.add_mutually_exclusive_group(required=True)
    sizes.add_argument("--widths", help="comma-separated d_model values")
    sizes.add_argument("--depths", help="comma-separated depths in blocks (model.n_layers)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per shape (default 3)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per shape: train.seed, +1, ... (default 1)")
    p.add_argument("--lr", type=float, default=None, help="the constant learning rate (default: train.lr)")
    p.add_argument("--batch", type=int, default=4, help="rows per step (default 4)")
    p.add_argument("--seq-len", type=int, default=32, help="tokens per row (default 32)")
    p.add_argument("--device", default="cpu", help="where each shape trains: cpu (default) or cuda")
    p.add_argument("--out", required=True, type=Path, help="where coordcheck.json and the plots go")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    from rrtrain.planning.coordcheck import Plan, coordcheck, parse_sizes

    args = parse(argv)
    if args.steps < 1 or args.seeds < 1 or args.batch < 1 or args.seq_len < 2:
        raise UsageError("--steps, --seeds and --batch must be at least 1, --seq-len at least 2")
    if args.device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda, got {args.device!r}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device here")
    axis, text = ("width", args.widths) if args.widths else ("depth", args.depths)
    plan = Plan(parametrization=args.parametrization, axis=axis, sizes=parse_sizes(text, axis + "s"),
                steps=args.steps, seeds=args.seeds, lr=args.lr, batch=args.batch, seq_len=args.seq_len,
                device=args.device)
    summary = coordcheck(None if args.config == "-" else args.config, args.overrides, plan, args.out)
    print(f"coordcheck: {summary['records']} records in {args.out / 'coordcheck.json'}; plots: "
          f"{', '.join(summary['plots']) or 'none'}")
    print(delta_line(summary["h_delta"], plan.parametrization))
    return 0


def delta_line(h: dict, parametrization: str) -> str:
    """`h_delta (sp, last block, step 3): 4: 0.96, 8: 0.967; change in log per doubling +0.075`."""
    values = ", ".join(f"{size}: {v:.4g}" for size, v in sorted(h["values"].items()))
    slope = h["slope_per_doubling"]
    return (f"h_delta ({parametrization}, last block, step {h['step']}): {values or 'none'}; change in log per "
            f"doubling {'—' if slope is None else f'{slope:+.3f}'}")

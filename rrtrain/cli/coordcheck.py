"""`rrtrain coordcheck CONFIG [key=value ...] --parametrization P --widths W1,W2,... | --depths L1,L2,...
--steps N --seeds S --out DIR`: the coordinate check of a parametrization (docs/transfer.md).

Each shape (CONFIG's model at each width, d_ff = 4 d, or each depth in blocks) trains N steps in process at the
config's train.lr (or --lr: make it large) on the built-in synthetic stories (or data.path); per (shape, seed,
step, layer) it records mean |h|, mean |h_t - h_0|, the attention logits, the output logits and each gate's mean
(rrtrain/planning/coordcheck.py) into DIR/coordcheck.json, and draws one PNG per quantity. A rule the
parametrization refuses is refused in one line (exit 2).
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
    p.add_argument("--out", required=True, type=Path, help="where coordcheck.json and the plots go")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    from rrtrain.planning.coordcheck import Plan, coordcheck, parse_sizes

    args = parse(argv)
    if args.steps < 1 or args.seeds < 1 or args.batch < 1 or args.seq_len < 2:
        raise UsageError("--steps, --seeds and --batch must be at least 1, --seq-len at least 2")
    axis, text = ("width", args.widths) if args.widths else ("depth", args.depths)
    plan = Plan(parametrization=args.parametrization, axis=axis, sizes=parse_sizes(text, axis + "s"),
                steps=args.steps, seeds=args.seeds, lr=args.lr, batch=args.batch, seq_len=args.seq_len)
    summary = coordcheck(None if args.config == "-" else args.config, args.overrides, plan, args.out)
    print(f"coordcheck: {summary['records']} records in {args.out / 'coordcheck.json'}; plots: "
          f"{', '.join(summary['plots']) or 'none'}")
    return 0

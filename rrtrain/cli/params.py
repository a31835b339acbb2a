"""`rrtrain params`: parameter counts per variant at a size, and parameter matching by widening."""

from __future__ import annotations

import argparse
import dataclasses
import json

from rrtrain.config import Config, apply_overrides, build, validate
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain import sizing
from rrtrain.knobs import check_keys as check_knobs
from rrtrain.resolve import check_model, check_rule, rule_named


def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain params", description=__doc__)
    p.add_argument("--size", required=True, help="a preset: " + ", ".join(sizing.presets()))
    p.add_argument("--variants", default="standard", help="comma-separated residual rules")
    p.add_argument("--match", default=None, metavar="REF", help="widen every other variant to REF's count")
    p.add_argument("--widen", choices=["mlp", "model"], default="mlp", help="what to widen (default: mlp)")
    p.add_argument("--tolerance", type=float, default=0.005, help="matching tolerance (default 0.005)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="model overrides, e.g. --set residual.gate_rank=128 --set vocab_size=32000 (a residual "
                        "knob: of one of the variants or of --match's rule)")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants:
        raise UsageError("--variants is empty")
    overrides = [f"model.{kv}" for kv in args.set] + [f"model.size={args.size}"]
    cfg: Config = build(Config, apply_overrides({}, overrides))
    for name in variants + ([args.match] if args.match else []):
        check_rule(name)
    cfg.model.variant = variants[0]
    validate(cfg)
    rules = [rule_named(name) for name in dict.fromkeys(variants + ([args.match] if args.match else []))]
    check_knobs(cfg.model.residual, rules)  # each key a knob of one of the rules counted (typed per rule below)
    check_model(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, residual={})))  # the preset, the shape
    sized = sizing.size_variants(cfg.model, variants, args.match, args.widen, args.tolerance)
    if args.json:
        out = {"reference": args.match, "variants": {
            name: {"params": s.params, "gate_params": s.gate_params, "d_model": s.shape.d_model,
                   "d_ff": s.shape.d_ff, "n_layers": s.shape.n_layers, "n_heads": s.shape.n_heads}
            for name, s in sized.items()}}
        print(json.dumps(out, indent=2))
        return 0
    print(f"size {args.size}" + (f", matched to {args.match} by widening {args.widen}" if args.match else ""))
    print(f"{'variant':<16}{'params':>16}{'rule extra':>14}{'extra %':>9}{'d_model':>9}{'d_ff':>7}{'blocks':>8}{'heads':>7}")
    for name, s in sized.items():
        pct = 100.0 * s.gate_params / s.params
        print(f"{name:<16}{s.params:>16,}{s.gate_params:>14,}{pct:>8.2f}%{s.shape.d_model:>9}{s.shape.d_ff:>7}"
              f"{s.shape.n_layers:>8}{s.shape.n_heads:>7}")
    return 0

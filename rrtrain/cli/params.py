"""`rrtrain params`: parameter counts per variant at a size, and parameter matching by widening; with
`--set parametrization=mup|completep`, each variant's multipliers and optimizer groups (docs/transfer.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from rrtrain.config import Config, validate
from rrtrain.config_load import apply_overrides, build
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain import sizing
from rrtrain.knobs import check_keys as check_knobs
from rrtrain.resolve import check_model, check_rule, parametrization_of, rule_named, spec_of_model


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
    # the preset, the shape (each variant's parametrization is shown per row below, refused or not)
    check_model(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, residual={}, parametrization="sp")))
    sized = sizing.size_variants(cfg.model, variants, args.match, args.widen, args.tolerance)
    groups = parametrization_rows(cfg, sized)
    if args.json:
        out = {"reference": args.match, "variants": {
            name: {"params": s.params, "gate_params": s.gate_params, "d_model": s.shape.d_model,
                   "d_ff": s.shape.d_ff, "n_layers": s.shape.n_layers, "n_heads": s.shape.n_heads,
                   **({"parametrization": groups[name]} if groups else {})}
            for name, s in sized.items()}}
        print(json.dumps(out, indent=2))
        return 0
    print(f"size {args.size}" + (f", matched to {args.match} by widening {args.widen}" if args.match else ""))
    print(f"{'variant':<16}{'params':>16}{'rule extra':>14}{'extra %':>9}{'d_model':>9}{'d_ff':>7}{'blocks':>8}{'heads':>7}")
    for name, s in sized.items():
        pct = 100.0 * s.gate_params / s.params
        print(f"{name:<16}{s.params:>16,}{s.gate_params:>14,}{pct:>8.2f}%{s.shape.d_model:>9}{s.shape.d_ff:>7}"
              f"{s.shape.n_layers:>8}{s.shape.n_heads:>7}")
    for name, row in groups.items():
        print_parametrization(name, row)
    return 0


def parametrization_rows(cfg: Config, sized: dict) -> dict[str, dict]:
    """Per variant, under mup/completep: the multipliers and optimizer groups a run at that shape would use (its
    model built on the meta device: no memory), or {"refused": why}; {} under sp."""
    from rrtrain.model.parametrization import refusal
    from rrtrain.model.transformer import build_model
    from rrtrain.parallel.adamw import parametrization_record

    p = parametrization_of(cfg.model)
    if p.is_sp:
        return {}
    rows = {}
    for name, s in sized.items():
        rule = rule_named(name)
        why = refusal(p, rule)
        if why:
            rows[name] = {"refused": why}
            continue
        spec = spec_of_model(cfg.model, s.shape, rule, sizing.knobs_of(rule, cfg.model.residual))
        rows[name] = parametrization_record(build_model(spec, device="meta"), cfg.train)
    return rows


def print_parametrization(name: str, row: dict) -> None:
    if "refused" in row:
        print(f"\n{name}: {row['refused']}")
        return
    fmt = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    print(f"\n{name}: {row['parametrization']} (base d_model {row['base_d_model']}, {row['base_n_layers']} blocks, "
          f"alpha {row['alpha']}): m_w {fmt(row['width_mult'])}, m_L {fmt(row['depth_mult'])}, branch x "
          f"{fmt(row['branch_multiplier'])} ({row['composition']['branch']}), logits x {fmt(row['logit_multiplier'])}, "
          f"attention scale {fmt(row['attention_scale'])}, hidden init std x {fmt(row['hidden_init_std_factor'])}")
    print(f"  {'group':<16}{'tensors':>8}{'params':>14}{'lr x':>10}{'eps':>11}{'wd':>9}")
    for g in row["groups"]:
        print(f"  {g['role']:<16}{g['tensors']:>8}{g['params']:>14,}{g['lr_scale']:>10.4g}{g['eps']:>11.3g}"
              f"{g['weight_decay']:>9.4g}")

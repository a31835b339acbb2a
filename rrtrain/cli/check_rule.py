"""`rrtrain check-rule NAME [--data DIR] [--only CHECKS] [--set residual.KEY=VALUE] [--json]`

Runs the generic checks (rrtrain/cli/rule_checks.py) on one registered residual rule, a built-in one or one
from an installed package: oracle-free sanity, the parameter count against the spec's formula, compile without
graph breaks, exact resume, FSDP parity on 2 CPU ranks. One line per check; exit 0 when all pass, 1 when one
fails, 2 on bad input. Without --data the training checks prepare a small synthetic dataset first.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import tempfile
from pathlib import Path

from data_prep.options import PrepOptions, command
from rrtrain import residuals
from rrtrain.cli.rule_checks import CHECKS, Outcome, RuleUnderCheck, run_check
from rrtrain.config import Config, validate
from rrtrain.config_load import apply_overrides, build
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain.knobs import rule_knobs
from rrtrain.resolve import with_knobs

TRAINING_CHECKS = ("resume", "fsdp")


def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain check-rule", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a registered residual rule")
    p.add_argument("--data", type=Path, default=None, help="a dataset written by `rrtrain prep` (resume, fsdp)")
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated checks (default: {','.join(CHECKS)})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="model overrides for the rule's knobs, e.g. --set residual.streams=2")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def selected(only: str) -> list[str]:
    names = [c.strip() for c in only.split(",") if c.strip()]
    for name in names:
        if name not in CHECKS:
            close = difflib.get_close_matches(name, CHECKS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"--only: unknown check '{name}'{hint}; known: {', '.join(CHECKS)}")
    if not names:
        raise UsageError("--only is empty")
    return names


def prepare_data(out: Path) -> Path:
    """A small byte-level synthetic dataset (sequences of 64 tokens), as the test suite trains on."""
    cmd = command(PrepOptions(source="synthetic:stories", out=str(out), tokenizer="byte", seq_len=64, num_docs=300,
                              seed=0))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise UsageError(f"could not prepare a dataset for the training checks: {proc.stderr.strip()[-300:]}")
    return out


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.name not in residuals.names():
        close = difflib.get_close_matches(args.name, residuals.names(), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(f"unknown residual rule '{args.name}'{hint}; known: {', '.join(residuals.names())}")
    checks = selected(args.only)
    cfg: Config = build(Config, apply_overrides({}, [f"model.{kv}" for kv in args.set] + [f"model.variant={args.name}"]))
    validate(cfg)
    knobs = rule_knobs(residuals.get(args.name), with_knobs(cfg).model.residual)  # an unknown key names the closest
    if args.data is not None and not args.data.is_dir():
        raise UsageError(f"--data {args.data}: not a directory")
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="rrtrain-check-rule-") as tmp:
        data = args.data
        if data is None and any(c in TRAINING_CHECKS for c in checks):
            data = prepare_data(Path(tmp) / "data")
        rule = RuleUnderCheck(args.name, knobs, data, Path(tmp) / "runs")
        for name in checks:
            outcome = run_check(name, rule)
            outcomes.append(outcome)
            if not args.json:
                print(f"{'ok' if outcome.ok else 'FAIL':<5} {name:<8} {outcome.seconds:>6.1f} s  {outcome.detail}",
                      flush=True)
    passed = all(o.ok for o in outcomes)
    if args.json:
        print(json.dumps({"rule": args.name, "passed": passed,
                          "checks": [o.__dict__ for o in outcomes]}, indent=2))
    else:
        print(f"{args.name}: {sum(o.ok for o in outcomes)}/{len(outcomes)} checks passed")
    return 0 if passed else 1

"""`rrtrain NAME ...`: dispatch to each subcommand's `main(argv) -> int`.

Subcommands are imported lazily so that `rrtrain params` does not pay for importing DeepSpeed.
A `UsageError` anywhere below becomes a one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable

from rrtrain.core.command import run_command
from rrtrain.core.errors import fail

COMMANDS: dict[str, tuple[str, str]] = {
    "prep": ("rrtrain.cli.prep", "shard a corpus into tokenized, packed MDS datasets"),
    "params": ("rrtrain.cli.params", "parameter counts per variant, with parameter matching"),
    "train": ("rrtrain.train", "one training run (same entry point as torchrun -m rrtrain.train)"),
    "bench": ("rrtrain.planning.bench", "throughput, MFU and memory of one configuration"),
    "plan": ("rrtrain.cli.plan", "memory per GPU and time for a run, before spending it"),
    "report": ("rrtrain.cli.report", "significance tables and scaling plots from a sweep directory"),
    "demo": ("rrtrain.cli.demo", "the embedded default, end to end"),
    "sweep": ("rrtrain.cli.sweep", "expand a sweep file and submit its runs (slurm, local, debug)"),
    "status": ("rrtrain.cli.status", "one row per run of a sweep or folder of runs: state, step, loss, flags"),
    "dashboard": ("rrtrain.cli.dashboard", "TensorBoard on loopback over a sweep's runs (per-size charts, HParams)"),
    "check-rule": ("rrtrain.cli.check_rule", "the generic checks on one residual rule (built-in or installed)"),
    "eval": ("rrtrain.cli.eval", "downstream tasks (lm-evaluation-harness) on a run's checkpoint"),
    "export": ("rrtrain.cli.export", "a run's checkpoint as a Hugging Face model directory (safetensors)"),
    "coordcheck": ("rrtrain.cli.coordcheck", "the coordinate check of a parametrization across widths or depths"),
}


def _usage() -> str:
    lines = ["usage: rrtrain NAME [ARGS...]", "", "commands:"]
    for name, (module, doc) in COMMANDS.items():
        lines.append(f"  {name:<8} {doc}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return fail("rrtrain", f"unknown command '{name}'{hint}; see 'rrtrain --help'")
    module = importlib.import_module(COMMANDS[name][0])
    entry: Callable[[list[str]], int] = module.main
    return run_command(f"rrtrain {name}", entry, rest)


if __name__ == "__main__":
    sys.exit(main())

"""`rrtrain status DIR [--json] [--watch [--interval S]]`

One row per run of a sweep (or of any folder of runs, as `rrtrain report` and `dashboard` take: without sweep.json,
each run directory below DIR, named by its path under it): id, variant, size, seed, scheduler state (squeue, when there is one), run state,
step / total, tokens, last train and val loss, tokens/s, flags; the runs that need attention first and the
counts by state at the bottom. Reads sweep.json and each run's final.json, lock and the tail of its
metrics.jsonl: a 200-run sweep takes well under 2 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from launchers.state.cache import StatusCache
from launchers.state.status import collect, table
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError



def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain status", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", metavar="DIR", help="a sweep directory, or any folder of runs")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--watch", action="store_true", help="refresh until interrupted")
    p.add_argument("--interval", type=float, default=10.0, help="--watch: seconds between refreshes")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    sweep_dir = Path(args.sweep_dir)
    if args.interval <= 0:
        raise UsageError(f"--interval must be positive, got {args.interval}")
    cache = StatusCache() if args.watch else None  # a refresh reads only what changed since the last one
    while True:
        status = collect(sweep_dir, cache)
        text = json.dumps(status) if args.json else table(status)
        if args.watch and not args.json and sys.stdout.isatty():
            sys.stdout.write("\x1b[H\x1b[2J")
        print(text, flush=True)
        if not args.watch:
            return 0
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0

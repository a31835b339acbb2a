"""`--executor debug`: the runs one after another inside this process (breakpoints work; the live code is
used, not the sweep's snapshot)."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Optional

from launchers.executors.base import Submitted
from launchers.executors.entry import config_path
from launchers.sweep.expand import Run


def submit(runs: list[Run], configs: dict[str, Path]) -> tuple[dict[str, Optional[str]], dict[str, int]]:
    from rrtrain.resolve import load
    from rrtrain.train import run as train

    jobs: dict[str, Optional[str]] = {}
    codes: dict[str, int] = {}
    for run in runs:
        jobs[run.id] = "debug"
        print(f"[debug] {run.id}", flush=True)
        try:
            codes[run.id] = train(load(configs[run.id]))
        except Exception:  # a failed run is reported, the sweep goes on
            traceback.print_exc()
            codes[run.id] = 1
        print(f"[debug] {run.id} ended with exit status {codes[run.id]}", flush=True)
    return jobs, codes


class DebugExecutor:
    """`--executor debug` behind the one interface (`launchers.executors.base.Executor`): returns once every run
    ended."""

    name = "debug"
    waits = True

    def submit(self, runs: list[Run], sweep_dir: Path, name: str, code: str) -> Submitted:
        return Submitted(*submit(runs, {r.id: config_path(sweep_dir, r.id) for r in runs}))

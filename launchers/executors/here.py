"""Running a sweep's runs on this machine (`--executor local` or `debug`), one submission: shared by a plain
submission (`rrtrain.cli.sweep`) and each pass of a pruned one (`launchers.submit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from launchers import cancel
from launchers.sweep.expand import Run


def run_here(executor: str, runs: list[Run], python: str, code: str, configs: dict[str, Path], out: Path,
             parallel: int, cancel_flagged: bool) -> Optional[tuple[dict[str, Optional[str]], dict[str, int]]]:
    """(job ids, exit codes) of `runs` trained here; None when interrupted (said on stdout: the running runs
    stopped at a step boundary and resume on the next submission)."""
    if executor == "local":
        from launchers.executors import local as local_executor

        try:
            poll = (lambda: cancel.cancel_flagged(out)) if cancel_flagged else None
            return local_executor.submit(runs, python, code, configs, out / "slurm" / "logs", parallel, on_poll=poll)
        except KeyboardInterrupt:
            print("interrupted: the running runs were stopped at a step boundary; submit again to resume them")
            return None
    from launchers.executors import debug as debug_executor

    return debug_executor.submit(runs, configs)

"""How every command ends: a `UsageError` is one line and exit status 2, a `RunError` one line and 1, never a
traceback; a distributed run ends its process without finalising. Shared by `rrtrain NAME` (rrtrain.cli.main)
and `python -m rrtrain.train` (torchrun's entry), which sit at different layers."""

from __future__ import annotations

import sys
from typing import Callable

from rrtrain.core.errors import RUN_ERROR_EXIT, RunError, UsageError, fail


def run_command(prog: str, entry: Callable[[list[str]], int], argv: list[str]) -> int:
    """`entry(argv)`'s exit status, with bad input and run errors said in one line under `prog`."""
    try:
        code = int(entry(argv) or 0)
    except UsageError as err:
        code = fail(prog, str(err))
    except RunError as err:
        fail(prog, str(err))
        code = RUN_ERROR_EXIT
    if code:
        import gc

        # a failed run's objects sit in cycles with the traceback; freed now, streaming releases its shared
        # memory before exit instead of warning about it then
        gc.collect()
    dist = sys.modules.get("rrtrain.core.dist")  # not imported by commands that load no torch (status)
    if dist is not None and dist.started_group():
        dist.exit_process(code)  # a distributed train/bench: end without finalising (see exit_process)
    return code

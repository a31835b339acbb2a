"""`rrtrain dashboard SWEEP_DIR`: the live dashboard (`rrtrain.dashboard.tensorboard`) with the `rrtrain status`
table as the `_sweep` run's summary, refreshed with the logdir.

The dashboard package sits below `launchers` (docs/architecture.md), so it cannot ask for the status itself: this
command, at the CLI floor, hands it a callable that renders the table. The callable keeps one
`launchers.state.cache.StatusCache`, as `rrtrain status --watch` does, so a refresh reads only what changed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from launchers.sweep import record
from launchers.state import status as sweep_status
from launchers.state.cache import StatusCache
from rrtrain.core.errors import UsageError


class StatusSummary:
    """The `rrtrain status SWEEP_DIR` table as markdown (a code block: the same text, columns aligned), or None
    where there is no sweep.json to read (a directory of runs not written by `rrtrain sweep`): the dashboard then
    shows its own table. It only reads, as `rrtrain status` does: cancelling is `rrtrain sweep --cancel-flagged`'s."""

    def __init__(self, sweep: Path) -> None:
        self.sweep = sweep
        self.cache = StatusCache()
        self.said: Optional[str] = None  # the last problem said on stderr

    def __call__(self) -> Optional[str]:
        if not record.path(self.sweep).is_file():
            return None
        try:
            status = sweep_status.collect(self.sweep, self.cache)
        except UsageError as err:  # sweep.json is not a record: said once, the dashboard's own table meanwhile
            if str(err) != self.said:
                print(f"rrtrain dashboard: sweep table: {err}", file=sys.stderr, flush=True)
                self.said = str(err)
            return None
        self.said = None
        # an indented code block: nothing in a run's id or flags can end it early
        return "\n".join("    " + line for line in sweep_status.table(status).splitlines())


def main(argv: list[str]) -> int:
    from rrtrain.dashboard import tensorboard

    return tensorboard.main(argv, summary_of=StatusSummary)

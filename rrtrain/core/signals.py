"""Stop at the next step boundary on SIGTERM, SIGUSR1, SIGUSR2 (Slurm preemption and time-limit warnings;
submitit uses USR2) and SIGINT. The handler only sets a flag; the loop agrees on it across ranks."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Optional

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)


class StopFlag:
    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: dict[int, object] = {}

    def install(self) -> "StopFlag":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self.signum = signum

    @property
    def name(self) -> Optional[str]:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()


def ignore_stop_signals() -> None:
    """For data-loader worker processes: the main process alone decides when to stop."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)

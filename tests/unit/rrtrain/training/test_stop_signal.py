"""The stop signal's agreement (`StopSignal`): every rank stops at the same step and records the same signal,
whichever rank took it first (Slurm's warning reaches the tasks of different nodes at different moments), and only
at the steps of its cadence. A fake loop stands for the ranks' all-reduce (`Loop.any_rank`: the largest value)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

from rrtrain.core.signals import StopFlag
from rrtrain.training.callbacks import StopSignal


def loop_of(step: int, peer: int) -> SimpleNamespace:
    """Rank 0's loop in a world whose other rank holds `peer` (its signal's number, 0 for none)."""
    calls: list[int] = []
    stops: list[tuple] = []

    def any_rank(flag: int) -> int:
        calls.append(flag)
        return max(int(flag), peer)

    return SimpleNamespace(step=step, any_rank=any_rank, calls=calls, stops=stops,
                           request_stop=lambda *a, **k: stops.append((*a, k)))


def test_a_signal_another_rank_took_is_the_one_recorded():
    loop = loop_of(4, int(signal.SIGUSR2))
    StopSignal(StopFlag(), every=2).on_step_end(loop)  # no signal on this rank
    assert loop.calls == [0]
    assert loop.stops == [("preempted", "stopped by SIGUSR2 at step 4", {"signal": "SIGUSR2"})]


def test_ranks_that_took_different_signals_agree_on_one():
    flag = StopFlag()
    flag.signum = int(signal.SIGUSR2)
    loop = loop_of(4, int(signal.SIGTERM))
    StopSignal(flag, every=2).on_step_end(loop)
    assert loop.calls == [int(signal.SIGUSR2)] and loop.stops[0][2] == {"signal": "SIGTERM"}


def test_no_signal_anywhere_or_off_the_cadence_stops_nothing():
    quiet = loop_of(4, 0)
    StopSignal(StopFlag(), every=2).on_step_end(quiet)
    assert quiet.calls == [0] and quiet.stops == []
    off = loop_of(5, int(signal.SIGUSR2))
    StopSignal(StopFlag(), every=2).on_step_end(off)
    assert off.calls == [] and off.stops == []  # no collective off the cadence

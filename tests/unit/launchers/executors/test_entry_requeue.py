"""A non-zero rank of a preempted submitit job waits for rank 0 to requeue the job; the requeue ends the job
step with SIGTERM, and the rank must end on it at once, whether the TERM comes while it waits or came before
(the ranks leave training at slightly different times). submitit's own TERM handler only logs it: the task
would sit out Slurm's KillWait until the SIGKILL while the requeued job waits for it."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest

from launchers.executors import entry

RANK1 = SimpleNamespace(global_rank=1, _usr_sig=lambda: signal.SIGUSR2)
REAL_SLEEP = time.sleep


@pytest.fixture
def submitits_term_handler(monkeypatch):
    """SIGTERM as submitit leaves it (a handler that only logs), restored afterwards; a short grace."""
    monkeypatch.setattr(entry, "REQUEUE_GRACE_S", 20.0)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_waiting_rank_ends_on_the_requeues_sigterm(submitits_term_handler, monkeypatch):
    """The TERM arrives once the rank sleeps out its grace: the handler ends the sleep (20 s, the bound on a
    hang: after it `requeue` raises RunFailed, not SystemExit)."""
    naps = []

    def sleep_then_term(seconds: float) -> None:
        naps.append(seconds)
        os.kill(os.getpid(), signal.SIGTERM)  # Slurm ending the job step while this rank waits
        REAL_SLEEP(seconds)

    monkeypatch.setattr(entry.time, "sleep", sleep_then_term)
    with pytest.raises(SystemExit) as ended:
        entry.requeue(RANK1, "r0")
    assert ended.value.code == entry.PREEMPTED_EXIT and naps == [entry.REQUEUE_GRACE_S]


def test_a_sigterm_before_the_wait_ends_the_rank_too(submitits_term_handler, monkeypatch):
    """A TERM seen before the wait ends the rank without waiting at all."""
    term = entry.TermWatch().install()
    signal.raise_signal(signal.SIGTERM)  # after training, before this rank reached the wait (handled on return)
    assert term.seen
    naps = []
    monkeypatch.setattr(entry.time, "sleep", naps.append)
    with pytest.raises(SystemExit) as ended:
        entry.requeue(RANK1, "r0", term)
    assert ended.value.code == entry.PREEMPTED_EXIT and naps == []

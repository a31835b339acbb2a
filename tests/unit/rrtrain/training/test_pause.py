"""`pause.json` and the callback that honours it (`rrtrain.training.pause.PauseAt`), on a stand-in loop: the
run checkpoints and ends `paused` after exactly the step named, with no end-of-run evaluation; a stale request
(at or behind the run, or at its end) is ignored; a step the run cannot stop at, or an unreadable file, is
refused in one line. The real pause, resume and exact continuation: tests/e2e/test_sweep_prune.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rrtrain.core.errors import UsageError
from rrtrain.rundir import writers
from rrtrain.rundir.outcome import EXIT_CODES, Outcome
from rrtrain.rundir.readers import read_pause
from rrtrain.training.pause import PauseAt


class FakeLoop:
    def __init__(self, run_dir: Path, step: int = 0, total: int = 40) -> None:
        self.facts = SimpleNamespace(run_dir=run_dir)
        self.step, self.total_steps = step, total
        self.calls: list[tuple] = []

    def save_checkpoint(self, background: bool = False) -> None:
        self.calls.append(("save", self.step, background))

    def request_stop(self, status, reason, checkpoint=True, signal=None) -> None:
        self.calls.append(("stop", self.step, status, checkpoint, reason))


def steps(cb: PauseAt, loop: FakeLoop, upto: int) -> None:
    cb.on_start(loop)
    while loop.step < upto:
        loop.step += 1
        cb.on_step_end(loop)


def test_the_run_checkpoints_and_pauses_after_exactly_the_step_named(tmp_path):
    writers.write_pause(tmp_path, 20, "rung 1 of 2")
    loop = FakeLoop(tmp_path)
    steps(PauseAt(10), loop, 30)
    assert loop.calls == [("save", 20, False),
                          ("stop", 20, "paused", False, "paused after step 20 (rung 1 of 2)")]
    assert Outcome("paused", "").exit_code == EXIT_CODES["paused"] == 5


@pytest.mark.parametrize("at,start", [(20, 20), (20, 25), (40, 0)])
def test_a_stale_request_or_one_at_the_end_is_ignored(tmp_path, at, start):
    writers.write_pause(tmp_path, at, "")
    loop = FakeLoop(tmp_path, step=start)
    steps(PauseAt(5), loop, 40)
    assert loop.calls == []


def test_no_file_no_pause_and_clear_pause_removes_it(tmp_path):
    loop = FakeLoop(tmp_path)
    steps(PauseAt(5), loop, 40)
    assert loop.calls == []
    writers.write_pause(tmp_path, 10, "")
    writers.clear_pause(tmp_path)
    writers.clear_pause(tmp_path)  # nothing to clear: fine
    assert read_pause(tmp_path) is None


def test_a_step_off_the_stop_check_or_an_unreadable_file_is_refused_in_one_line(tmp_path):
    writers.write_pause(tmp_path, 7, "")
    with pytest.raises(UsageError, match=r"step 7 is not a multiple of train.stop_check_every=5"):
        PauseAt(5).on_start(FakeLoop(tmp_path))
    for body, why in (('{"step": 0}', "not a positive integer"), ('{"step": "x"}', "not a positive integer"),
                      ("[1]", "not a JSON object"), ('{"ste', "truncated or not JSON")):
        (tmp_path / "pause.json").write_text(body)
        with pytest.raises(UsageError, match=why) as err:
            PauseAt(5).on_start(FakeLoop(tmp_path))
        assert "\n" not in str(err.value)

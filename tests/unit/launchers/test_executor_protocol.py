"""One executor interface and one submit loop (launchers.executors.base, launchers.submit): slurm, local and debug
take the same `submit(runs, sweep_dir, name, code)`, and a plain sweep goes through the loop as a pruned sweep
with no rungs: one pass, every run that needs it to its end, recorded once. Budget: well under 1 s (no training:
a recording stand-in executor)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest

from launchers import submit
from launchers.executors.base import Executor, Interrupted, SubmitError, Submitted
from launchers.executors.debug import DebugExecutor
from launchers.executors.local import LocalExecutor
from launchers.executors.slurm import SlurmExecutor
from launchers.sweep import record
from launchers.sweep.expand import Run
from launchers.sweep.spec import Resources
from rrtrain.core.errors import UsageError

CONFIG = {"train": {"max_steps": 10, "tokens": None, "global_batch": 8}, "model": {"size": "tiny", "seq_len": 16},
          "data": {"path": None}, "run": {"dir": ""}}


def test_every_executor_has_the_one_signature():
    want = inspect.signature(Executor.submit)
    for cls in (SlurmExecutor, LocalExecutor, DebugExecutor):
        assert inspect.signature(cls.submit) == want, cls
        assert isinstance(cls.name, str) and isinstance(cls.waits, bool)
    assert (SlurmExecutor.waits, LocalExecutor.waits, DebugExecutor.waits) == (False, True, True)


class Recorder:
    """A stand-in executor: records each submission, ends every run with `code` (None: queues them)."""

    def __init__(self, code: Optional[int] = 0, fail: bool = False, interrupt: bool = False) -> None:
        self.name, self.waits = ("local", True) if code is not None else ("slurm", False)
        self.code, self.fail, self.interrupt = code, fail, interrupt
        self.calls: list[tuple[list[str], Path, str, str]] = []

    def submit(self, runs: list[Run], sweep_dir: Path, name: str, code: str) -> Submitted:
        self.calls.append(([r.id for r in runs], sweep_dir, name, code))
        if self.interrupt:
            raise Interrupted()
        if self.fail:
            raise SubmitError("sbatch failed for tiny", {runs[0].id: "7_0"})
        jobs = {r.id: (f"local:{i}" if self.waits else f"7_{i}") for i, r in enumerate(runs)}
        return Submitted(jobs, {r.id: self.code for r in runs} if self.waits else {})


@pytest.fixture
def sweep(tmp_path):
    """Two runs never submitted, recorded in sweep.json with a code snapshot path."""
    runs = []
    for rid in ("tiny-review-s0", "tiny-standard-s0"):
        config = json.loads(json.dumps(CONFIG))
        config["run"]["dir"] = str(tmp_path / rid)
        runs.append(Run(rid, "tiny", rid.split("-")[1], 0, config, Resources()))
    rec = record.SweepRecord("proto", {r.id: record.RunEntry.of_run(r) for r in runs},
                             code={"path": str(tmp_path / "code")})
    record.save(tmp_path, rec)
    spec = SimpleNamespace(prune=None, name="proto", gpu="H100", mfu=0.4)
    return SimpleNamespace(out=tmp_path, runs=runs, sweep=SimpleNamespace(spec=spec))


def test_a_plain_sweep_is_one_pass_of_the_loop(sweep, capsys):
    ex = Recorder(code=0)
    assert submit.submit_loop(ex, sweep.sweep, sweep.out, sweep.runs) == 0
    assert ex.calls == [(["tiny-review-s0", "tiny-standard-s0"], sweep.out, "proto", str(sweep.out / "code"))]
    subs = record.load(sweep.out).submissions
    assert [s.executor for s in subs] == ["local"] and set(subs[0].jobs) == {r.id for r in sweep.runs}
    assert "2 of 2 runs completed" in capsys.readouterr().out


def test_a_failed_run_is_not_sent_again_and_exits_1(sweep, capsys):
    ex = Recorder(code=1)
    assert submit.submit_loop(ex, sweep.sweep, sweep.out, sweep.runs) == 1
    assert len(ex.calls) == 1
    assert "not completed: tiny-review-s0 (exit 1)" in capsys.readouterr().out


def test_a_queueing_executor_submits_once_and_returns(sweep, capsys):
    ex = Recorder(code=None)
    assert submit.submit_loop(ex, sweep.sweep, sweep.out, sweep.runs) == 0
    assert len(ex.calls) == 1
    out = capsys.readouterr().out
    assert "tiny-review-s0: job 7_0" in out and "submitted 2 runs; follow them with: rrtrain status" in out


def test_a_partial_submission_is_recorded_then_refused(sweep):
    ex = Recorder(code=None, fail=True)
    with pytest.raises(UsageError, match="sbatch failed for tiny"):
        submit.submit_loop(ex, sweep.sweep, sweep.out, sweep.runs)
    assert record.load(sweep.out).submissions[-1].jobs == {"tiny-review-s0": "7_0"}


def test_an_interrupted_executor_is_exit_130_and_records_nothing(sweep):
    assert submit.submit_loop(Recorder(interrupt=True), sweep.sweep, sweep.out, sweep.runs) == 130
    assert record.load(sweep.out).submissions == []

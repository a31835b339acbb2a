"""`rrtrain sweep --cancel-flagged` acts on the run directory it judged, never on what a name on its recorded path
leads to by the time it acts (`launchers.cancel.HeldRuns`: each run directory opened once, no link followed at any
component, before judging; judged, marked and signalled through that descriptor), and only in a sweep directory
that is the user's alone. The swap of a link happens deterministically between judging and acting: in the
`to_cancel` step, which takes the verdicts and hands back the runs to cancel. The victim is a real process holding
its run's lock as a training run does. About 0.5 CPU-s."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from launchers import cancel
from rrtrain.core.errors import UsageError
from rrtrain.cli.main import main as cli
from unit.launchers.test_sweep_cancel import hold_lock
from sweeputil import write_record


def write_flagged_run(run: Path, flag: str = "diverged") -> Path:
    """A run still going (no final.json) whose metrics.jsonl carries the monitor's `flag`."""
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("model: {size: tiny, variant: standard}\ntrain: {seed: 0}\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0, "tokens": 64}) + "\n"
                                       + json.dumps({"kind": "flag", "flag": flag, "step": 1}) + "\n")
    return run


def record_run(sweep: Path, run_dir: Path) -> None:
    write_record(sweep, {"version": 1, "name": "swap", "runs": {"victim": {
        "size": "tiny", "variant": "standard", "seed": 0, "dir": str(run_dir), "config": {}}},
        "submissions": [{"executor": "local", "jobs": {"victim": "local:1"}}]})


def repoint(link: Path, target: Path) -> None:
    """Make `link` a symbolic link to `target` in one rename, as an attacker would."""
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)


@pytest.fixture
def victim(tmp_path):
    """Another run, outside the sweep, healthy and training (a live lock holder): what must stay untouched."""
    run = tmp_path / "alice" / "victim"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0, "tokens": 64}) + "\n")
    proc = hold_lock(run)
    yield run, proc
    proc.kill()
    proc.wait()


def untouched(run: Path, proc: subprocess.Popen) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.3)  # a SIGTERM would have ended it by now
    assert not (run / "cancelled.json").exists(), "the marker was written into the victim's directory"


def swap_after_judging(monkeypatch, swap) -> None:
    """Run `swap()` once the runs are judged, before anything is acted on."""
    judged = cancel.to_cancel

    def hook(verdicts):
        chosen = judged(verdicts)
        swap()
        return chosen

    monkeypatch.setattr(cancel, "to_cancel", hook)


def test_a_link_on_the_recorded_path_is_refused_and_swapping_it_reaches_nothing(tmp_path, victim, monkeypatch,
                                                                                capsys):
    """The review's case: the record names SWEEP/L/victim with L -> real (a flagged run there); L is pointed at
    the victim's parent between judging and acting."""
    run, proc = victim
    sweep = tmp_path / "sweep"
    write_flagged_run(sweep / "real" / "victim")
    (sweep / "L").symlink_to(sweep / "real", target_is_directory=True)
    record_run(sweep, sweep / "L" / "victim")
    swap_after_judging(monkeypatch, lambda: repoint(sweep / "L", run.parent))
    try:
        done = cancel.cancel_flagged(sweep)
    except UsageError as err:  # sweep.json read again to record a cancellation: its entry leads out by now
        done = {"recorded": str(err)}
    untouched(run, proc)
    assert done == {}
    assert "run victim left alone" in capsys.readouterr().err
    assert not (sweep / "real" / "victim" / "cancelled.json").exists()


def test_a_directory_swapped_for_a_link_after_judging_is_acted_on_as_judged(tmp_path, victim, monkeypatch, capsys):
    """The record names SWEEP/D/victim, a plain directory when judged; then D is renamed away and a link to the
    victim's parent put in its place: the marker and the signal go to the run that was judged (the cancellation is
    then not recorded: sweep.json names a directory that now leads out of the sweep, refused in one line)."""
    run, proc = victim
    sweep = tmp_path / "sweep"
    judged_run = write_flagged_run(sweep / "D" / "victim")
    judged_proc = hold_lock(judged_run)
    try:
        record_run(sweep, judged_run)

        def swap() -> None:
            os.rename(sweep / "D", sweep / "D.judged")
            repoint(sweep / "D", run.parent)

        swap_after_judging(monkeypatch, swap)
        with pytest.raises(UsageError, match="outside the sweep directory"):  # sweep.json, read again to record
            cancel.cancel_flagged(sweep)
        assert "cancelled victim (SIGTERM to pid" in capsys.readouterr().out
        untouched(run, proc)
        assert (sweep / "D.judged" / "victim" / "cancelled.json").exists()
        assert judged_proc.wait(timeout=10) == -15  # the judged run's own holder got the SIGTERM
    finally:
        judged_proc.kill()
        judged_proc.wait()


def test_a_sweep_directory_others_can_write_is_refused(tmp_path, victim, capsys):
    run, proc = victim
    sweep = tmp_path / "sweep"
    judged_run = write_flagged_run(sweep / "victim")
    record_run(sweep, judged_run)
    sweep.chmod(0o775)
    assert cli(["sweep", "--cancel-flagged", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "can be written by its group" in err and len(err.strip().splitlines()) == 1, err
    assert not (judged_run / "cancelled.json").exists()
    assert "cancellations" not in json.loads((sweep / "sweep.json").read_text())

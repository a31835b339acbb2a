"""Cancelling flagged runs (`rrtrain sweep --cancel-flagged`, launchers.cancel) and the sweep-level flags in
`rrtrain status`, on run directories laid out like a sweep whose "running" runs are real processes holding
their run locks (the Slurm path, scancel, is tested on the local cluster in tests/slurm/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launchers import cancel
from launchers.sweep import record
from launchers.state import status as status_cli
from rrtrain.rundir.outcome import cancelled_status
from rrtrain.rundir.readers import Cancelled, read_cancelled
from unit.launchers.state.test_monitor_sweep import H, curve, descending, write_run
from sweeputil import write_record



HOLD = ("import sys, time; from rrtrain.rundir.lock import RunLock; RunLock(sys.argv[1]).acquire(0); "
        "print('held', flush=True); time.sleep(120)")


def hold_lock(run_dir: Path) -> subprocess.Popen:
    """A live process that holds the run's lock, as a training run does (rrtrain.rundir.lock.RunLock)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def make_sweep(tmp_path: Path) -> tuple[Path, dict[str, subprocess.Popen]]:
    """Three runs still going (one stalled at the unigram entropy) and one completed; sweep.json names them."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"unigram_entropy": H, "seq_len": 64}))
    sweep = tmp_path / "sweep"
    dirs = {
        "tiny-review_convex-s0": write_run(sweep, data, "tiny", "review_convex", 0, curve(600, H + 0.02, 3)),
        "tiny-review-s0": write_run(sweep, data, "tiny", "review", 0, descending(600, 0)),
        "tiny-standard-s0": write_run(sweep, data, "tiny", "standard", 0, descending(600, 7)),
        "tiny-review-s1": write_run(sweep, data, "tiny", "review", 1, descending(600, 1),
                                    final={"status": "completed", "step": 600, "tokens": 600 * 512, "flags": []}),
    }
    procs = {rid: hold_lock(d) for rid, d in dirs.items() if not (d / "final.json").exists()}
    runs = {rid: {"size": "tiny", "variant": rid.split("-")[1], "seed": int(rid[-1]), "dir": str(d),
                  "config": {"train": {"max_steps": 1000, "global_batch": 8}, "model": {"size": "tiny"},
                             "data": {"path": str(data)}, "monitor": {}}, "resources": {}}
            for rid, d in dirs.items()}
    jobs = {rid: f"local:{p.pid}" for rid, p in procs.items()}
    write_record(sweep, {"version": 1, "name": "cancel", "runs": runs,
                        "submissions": [{"executor": "local", "jobs": jobs}]})
    return sweep, procs


def test_status_shows_sweep_flags_and_cancel_stops_exactly_the_stalled_run(tmp_path):
    sweep, procs = make_sweep(tmp_path)
    try:
        rows = {r["id"]: r for r in status_cli.collect(sweep)["runs"]}
        assert "early_stall" in rows["tiny-review_convex-s0"]["flags"]
        assert rows["tiny-review_convex-s0"]["state"] == "running"
        assert "early_stall" not in rows["tiny-review-s0"]["flags"] + rows["tiny-standard-s0"]["flags"]
        assert status_cli.collect(sweep)["runs"][0]["id"] == "tiny-review_convex-s0"  # flagged runs first

        done = cancel.cancel_flagged(sweep)
        assert list(done) == ["tiny-review_convex-s0"] and "early_stall" in done["tiny-review_convex-s0"]
        assert procs["tiny-review_convex-s0"].wait(timeout=10) == -15  # SIGTERM: a run checkpoints and exits
        for rid in ("tiny-review-s0", "tiny-standard-s0"):
            assert procs[rid].poll() is None, f"{rid} was stopped but is not flagged"
        rec = record.load(sweep)
        assert list(rec.cancellations[-1]["runs"]) == ["tiny-review_convex-s0"]
        marker = read_cancelled(sweep / "tiny-review_convex-s0")
        assert marker is not None and "early_stall" in marker.flags

        rows = {r["id"]: r for r in status_cli.collect(sweep)["runs"]}
        row = rows["tiny-review_convex-s0"]
        assert row["state"] == "stalled" and "cancelled" in row["flags"], row
        assert rows["tiny-review-s0"]["state"] == "running"
        assert cancel.cancel_flagged(sweep) == {}  # cancelled once: nothing more to do
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_resubmission_leaves_a_cancelled_run_alone(tmp_path):
    from launchers.state.runstate import FINISHED

    sweep, procs = make_sweep(tmp_path)
    try:
        cancel.cancel_flagged(sweep)
        procs["tiny-review_convex-s0"].wait(timeout=10)
        row = {r["id"]: r for r in status_cli.collect(sweep)["runs"]}["tiny-review_convex-s0"]
        assert row["state"] in FINISHED  # `rrtrain sweep` skips FINISHED runs
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_cancel_flagged_needs_a_sweep_directory(tmp_path, capsys):
    """`rrtrain sweep --cancel-flagged` in this process (the command's main: an exception it let out would fail
    the test)."""
    from rrtrain.cli.main import main

    assert main(["sweep", "--cancel-flagged", str(tmp_path)]) == 2
    assert "no sweep.json" in capsys.readouterr().err


@pytest.mark.parametrize("flags,state", [(["stalled"], "stalled"), (["early_stall"], "stalled"),
                                         (["diverged"], "diverged")])
def test_a_cancelled_run_ends_as_what_it_was_flagged(flags, state):
    assert cancelled_status(Cancelled(reason="", flags=tuple(flags))) == state

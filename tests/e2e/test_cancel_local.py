"""`--cancel-flagged` on a real training run of the local executor: the cancel writes cancelled.json, then
signals the run; the run, ending on that signal, writes a final.json that says `stalled`, `cancelled` and why
the first time it is written (no `preempted` to be relabelled later), and exits with the stalled status.
(The same flow under Slurm, scancel included: tests/slurm/test_cancel_flagged.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launchers import cancel
from launchers.state import status as status_cli
from sweeputil import write_record
from trainutil import final, records, start

pytestmark = pytest.mark.slow

RID = "tiny-review-s0"
#: thresholds under which any run counts as stalled within a few steps (as in tests/slurm/test_cancel_flagged.py)
STALL_AT_ONCE = ["monitor.min_steps=5", "monitor.window=4", "monitor.min_improvement=0.9",
                 "monitor.entropy_margin=100.0"]


def wait_for_flag(run_dir: Path, proc, flag: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before any {flag} flag"
        if any(r.get("flag") == flag for r in records(run_dir)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {flag} flag in {timeout} s")


def test_a_cancelled_run_says_why_in_the_final_json_it_writes(tmp_path, stories_data):
    sweep = tmp_path / "sweep"
    run_dir = sweep / RID
    proc = start(run_dir, stories_data, "train.max_steps=100000", "train.log_every=1", "train.eval_every=0",
                 "train.ckpt_every=0", "train.global_batch=8", "train.micro_batch=8", "model.n_layers=2",
                 "train.compile=false", *STALL_AT_ONCE)  # 100,000 steps would compile ("auto"): 20 s of CPU
    try:
        config = {"train": {"max_steps": 100000, "global_batch": 8}, "model": {"size": "tiny"},
                  "data": {"path": str(stories_data)}}
        write_record(sweep, {"version": 1, "name": "cancel", "runs": {
            RID: {"size": "tiny", "variant": "review", "seed": 0, "dir": str(run_dir), "config": config,
                  "resources": {}}}, "submissions": [{"executor": "local", "jobs": {RID: f"local:{proc.pid}"}}]})
        wait_for_flag(run_dir, proc, "stalled")
        assert not (run_dir / "final.json").exists()

        done = cancel.cancel_flagged(sweep)
        assert list(done) == [RID] and "stalled" in done[RID]
        code = proc.wait(timeout=120)
        out = proc.stdout.read()
        fin = final(run_dir)
        assert code == 4, out[-3000:]
        assert fin["status"] == "stalled" and fin["exit_code"] == 4 and fin["signal"] == "SIGTERM", fin
        assert fin["reason"].startswith(f"cancelled as flagged ({done[RID]})"), fin["reason"]
        assert "cancelled" in fin["flags"] and fin["flag_details"]["cancelled"] == done[RID]
        assert fin["cancelled"]["reason"] == done[RID] and "stalled" in fin["cancelled"]["flags"]
        assert "preempted" not in out  # not even on the console: the run ended as what it was cancelled for

        row = {r["id"]: r for r in status_cli.collect(sweep)["runs"]}[RID]
        assert row["state"] == "stalled" and row["flags"].count("cancelled") == 1, row
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

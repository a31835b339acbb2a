"""Two `rrtrain sweep --executor slurm` on one directory at once, on the local cluster: the sweep lock makes the
second wait for the first, see its job queued and leave the run alone, so the run is submitted once and
sweep.json holds the job id the queue has (before the lock, both submitted and sweep.json kept one of them).
A third process holds the lock until both wait for it, so the race is run every time."""

from __future__ import annotations

import subprocess
import sys
import time

from slurmutil import cancel, submitted_jobs, sweep_file, wait_done
from trainutil import REPO, env


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


def test_two_slurm_submissions_at_once_submit_the_run_once(slurm_cluster, tmp_path, stories_data):
    out = tmp_path / "sweep"
    out.mkdir()
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review"], steps=2,
                      resources={"time_min": 5}, name="race")
    cmd = [sys.executable, "-m", "rrtrain", "sweep", str(spec), "--out", str(out), "--executor", "slurm",
           "--lock-wait", "120"]
    # a third process holds the sweep lock until both are waiting for it: both then race for it at once
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out / ".sweep.lock")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    errs = [tmp_path / f"err{i}" for i in range(2)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err.open("w"), text=True, env=env(), cwd=REPO)
             for err in errs]
    deadline = time.monotonic() + 120
    while not all("waiting up to 120 s" in err.read_text() for err in errs) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [err.read_text() for err in errs]
        time.sleep(0.2)
    holder.communicate("\n")
    outputs = [(p.communicate(timeout=300)[0], err.read_text()) for p, err in zip(procs, errs)]
    recorded = [job for sub in submitted_jobs(out) for job in sub.values()]
    try:
        assert all("waiting up to 120 s" in e for _, e in outputs), outputs
        for p, (stdout, stderr) in zip(procs, outputs):
            assert p.returncode == 0, stdout + stderr
        rows = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout.splitlines()
        queued = {row.split()[0].split("_")[0] for row in rows if row.split()[1:2] and row.split()[1].startswith("race-")}
        assert len(recorded) == 1, outputs  # one submission recorded ...
        assert queued <= {recorded[0].split("_")[0]}, (queued, recorded)  # ... and no other job in the queue
        assert sum("leaving it alone" in o for o, _ in outputs) == 1, outputs  # the second saw it queued
        assert wait_done(recorded[0], timeout=300) == {recorded[0]: "COMPLETED"}
    finally:
        cancel(*recorded)

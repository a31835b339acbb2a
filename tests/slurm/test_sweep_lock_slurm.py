"""Two `rrtrain sweep --executor slurm` on one directory at once, on the local cluster: the sweep lock makes the
second wait for the first, see its job queued and leave the run alone, so the run is submitted once and
sweep.json holds the job id the queue has (before the lock, both submitted and sweep.json kept one of them)."""

from __future__ import annotations

import subprocess
import sys

from slurmutil import cancel, submitted_jobs, sweep_file, wait_done
from trainutil import REPO, env


def test_two_slurm_submissions_at_once_submit_the_run_once(slurm_cluster, tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review"], steps=2,
                      resources={"time_min": 5}, name="race")
    cmd = [sys.executable, "-m", "rrtrain", "sweep", str(spec), "--out", str(out), "--executor", "slurm",
           "--lock-wait", "120"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=REPO)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    recorded = [job for sub in submitted_jobs(out) for job in sub.values()]
    try:
        for p, (stdout, stderr) in zip(procs, outputs):
            assert p.returncode == 0, stdout + stderr
        rows = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout.splitlines()
        queued = {row.split()[0].split("_")[0] for row in rows if row.split()[1:2] and row.split()[1].startswith("race-")}
        assert len(recorded) == 1, outputs  # one submission recorded ...
        assert queued <= {recorded[0].split("_")[0]}, (queued, recorded)  # ... and no other job in the queue
        assert any("leaving it alone" in o for o, _ in outputs) and any("waiting up to" in e for _, e in outputs)
        assert wait_done(recorded[0], timeout=300) == {recorded[0]: "COMPLETED"}
    finally:
        cancel(*recorded)

"""`rrtrain sweep --executor slurm` on the local cluster: a sweep runs as a job array to completion and
`rrtrain status --json` agrees; a run that raises is reported failed and is not requeued; submitting the
sweep again leaves the completed runs alone and resubmits only the failed one."""

from __future__ import annotations

from slurmutil import cancel, restarts, rrtrain, status, submitted_jobs, sweep_file, wait_done
from trainutil import env, final, records

STEPS = 8


def test_sweep_array_completes_and_only_the_failed_run_is_resubmitted(slurm_cluster, tmp_path, stories_data):
    empty = tmp_path / "not-a-dataset"
    empty.mkdir()
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review", "standard", "highway"],
                      steps=STEPS, resources={"time_min": 5, "array_parallelism": 2},
                      runs={"tiny-highway-s0": {"data.path": str(empty)}})  # this run raises in its set-up
    e = env()
    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [jobs] = submitted_jobs(out)
    assert sorted(jobs) == ["tiny-highway-s0", "tiny-review-s0", "tiny-standard-s0"]
    assert len({j.split("_")[0] for j in jobs.values()}) == 1, f"one array: {jobs}"
    try:
        states = {rid: wait_done(job, timeout=300)[job] for rid, job in jobs.items()}
    finally:
        cancel(*jobs.values())
    assert states == {"tiny-review-s0": "COMPLETED", "tiny-standard-s0": "COMPLETED",
                      "tiny-highway-s0": "FAILED"}, states
    assert restarts(jobs["tiny-highway-s0"]) == 0, "a failed run is not requeued"

    rows = {r["id"]: r for r in status(out, e)["runs"]}
    for rid in ("tiny-review-s0", "tiny-standard-s0"):
        assert rows[rid]["state"] == "completed", rows[rid]
        assert rows[rid]["step"] == rows[rid]["total_steps"] == STEPS
        assert [r["step"] for r in records(out / rid) if "loss" in r] == list(range(1, STEPS + 1))
        assert final(out / rid)["status"] == "completed"
    assert rows["tiny-highway-s0"]["state"] == "failed", rows["tiny-highway-s0"]
    assert final(out / "tiny-highway-s0")["status"] == "failed"

    again = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert again.returncode == 0, again.stdout + again.stderr
    second = submitted_jobs(out)[-1]
    try:
        assert sorted(second) == ["tiny-highway-s0"], again.stdout
        assert "tiny-review-s0: completed" in again.stdout and "tiny-standard-s0: completed" in again.stdout
        assert wait_done(second["tiny-highway-s0"], timeout=300) == {second["tiny-highway-s0"]: "FAILED"}
    finally:
        cancel(*second.values())

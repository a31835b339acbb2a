"""Successive halving through `rrtrain sweep --executor slurm` on the local cluster, with no process alive between
rungs: the first `rrtrain sweep` queues every point to its rung, where each job pauses (checkpointed; the job
completes, it is not a failure); the next ranks the group, marks the hopeless point `pruned` and queues the
survivor to its end; the one after finds nothing to do."""

from __future__ import annotations

import yaml

from slurmutil import cancel, rrtrain, status, submitted_jobs, sweep_file, wait_done
from trainutil import env, final, losses

STEPS, RUNG = 10, 5


def test_pruning_rung_by_rung_on_slurm(slurm_cluster, tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["standard"], steps=STEPS, name="prune",
                      resources={"time_min": 5, "array_parallelism": 2},
                      overrides={"train.eval_every": RUNG, "train.stop_check_every": RUNG, "model.n_layers": 2,
                                 "data.eval_batches": 1},
                      runs={"tiny-standard-s0": {"train.lr": 1e-6}, "tiny-standard-s1": {"train.lr": 3e-3}})
    body = yaml.safe_load(spec.read_text())
    body["sizes"]["tiny"]["seeds"] = 2  # two points of one (size, variant), a seed each; s0's is hopeless
    body["prune"] = {"rungs": [RUNG], "keep": 0.5}
    spec.write_text(yaml.safe_dump(body, sort_keys=False))
    e = env()

    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [jobs] = submitted_jobs(out)
    try:
        states = {rid: wait_done(job, timeout=300)[job] for rid, job in jobs.items()}
    finally:
        cancel(*jobs.values())
    assert states == {"tiny-standard-s0": "COMPLETED", "tiny-standard-s1": "COMPLETED"}, states
    for rid in jobs:
        assert (final(out / rid)["status"], final(out / rid)["step"]) == ("paused", RUNG)
    assert {r["id"]: r["state"] for r in status(out, e)["runs"]} == dict.fromkeys(jobs, "paused")

    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tiny-standard-s0: pruned at rung 1 of 1 (step 5)" in proc.stdout, proc.stdout
    second = submitted_jobs(out)[-1]
    assert list(second) == ["tiny-standard-s1"]
    try:
        assert wait_done(second["tiny-standard-s1"], timeout=300) == {second["tiny-standard-s1"]: "COMPLETED"}
    finally:
        cancel(*second.values())
    assert (final(out / "tiny-standard-s1")["status"], final(out / "tiny-standard-s1")["step"]) == ("completed", STEPS)
    assert sorted(losses(out / "tiny-standard-s1")) == list(range(1, STEPS + 1))
    assert final(out / "tiny-standard-s0")["status"] == "pruned" and max(losses(out / "tiny-standard-s0")) == RUNG

    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0 and "to go on" not in proc.stdout, proc.stdout
    assert len(submitted_jobs(out)) == 2
    st = status(out, e)
    assert st["counts"] == {"completed": 1, "pruned": 1} and st["pruning"]["pruned_runs"] == 1

"""The convergence monitor across nodes: a 2-node run (one rank per node) through `rrtrain sweep --executor
slurm`, set to count as stalled within a few steps and to stop on it (`monitor.on_stall: stop`). Every rank runs
the monitor on the all-reduced losses, so all decide the stop at the same step: each rank on both nodes ends by
itself with the run's outcome (each submitit task records the run as stalled, exit 4; none is killed or left
waiting in a collective), no process of the job is left on either node, final.json says stalled with the flag at
the step it stopped, and `rrtrain status` shows the run stalled, flagged, with its two nodes. One rank per node:
what is agreed across nodes is agreed by the one rank of each (a second rank per node would cost two more
interpreters and prove no more)."""

from __future__ import annotations

import time

import pytest

from rrtrain.rundir import ranks
from slurmutil import (NODES, STALL_AT_ONCE, cancel, job_logs, node_processes, rrtrain, status, submitted_jobs,
                       sweep_file, wait_done)
from trainutil import env, final, records

pytestmark = pytest.mark.distributed

RUN = "tiny-review-s0"
BOUND_S = 60  # from the flag's record to the end of the job on both nodes


def test_a_stall_on_two_nodes_stops_every_rank_and_status_shows_it(slurm_cluster, tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review"], steps=1000,
                      resources={"nodes": NODES, "tasks_per_node": 1, "mem_gb": 1, "time_min": 10},
                      overrides={**STALL_AT_ONCE, "monitor.on_stall": "stop", "parallel.backend": "fsdp",
                                 "train.micro_batch": 2})
    e = env()
    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = submitted_jobs(out)[-1][RUN]
    run = out / RUN
    try:
        states = wait_done(job, timeout=400)
        ended = time.time()
    finally:
        cancel(job)
    logs = job_logs(out)
    assert states == {job: "FAILED"}, logs  # submitit records every ending but "completed" as a failure
    fin = final(run)
    assert fin["status"] == "stalled" and fin["exit_code"] == 4 and fin["world_size"] == NODES, fin
    assert fin["flags"] == ["stalled"] and fin["flag_steps"]["stalled"] == fin["step"] < 1000, fin
    [flag] = [r for r in records(run) if r.get("kind") == "flag"]
    assert flag["flag"] == "stalled" and flag["step"] == fin["step"], flag
    assert ended - (run / "final.json").stat().st_mtime < BOUND_S

    # every task (rank) ended by itself with the run's outcome: submitit's log of each says so
    errs = sorted((out / "slurm" / "submitit").rglob("*_log.err"))
    assert len(errs) == NODES, (errs, logs)
    for err in errs:
        text = err.read_text(errors="replace")
        assert f"run {RUN} ended stalled (exit 4)" in text, f"{err.name}: {text[-3000:]}"
    hosts = {r["rank"]: r["host"] for r in ranks.read(run)}
    assert hosts == {0: "rrnode1", 1: "rrnode2"}, hosts
    assert all(node_processes(node, str(out)) == [] for node in ("rrnode1", "rrnode2")), "a task left running"

    [row] = status(out, e)["runs"]
    assert row["state"] == "stalled" and "stalled" in row["flags"], row
    assert row["nodes"] == ["rrnode1", "rrnode2"] and row["step"] == fin["step"], row


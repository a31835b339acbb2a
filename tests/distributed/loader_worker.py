"""Worker for test_loader_resume.py: runs the TrainLoader on every rank as the trainer does.

usage: python -m tests.distributed.loader_worker PLAN.json OUT.json, on each rank of an env:// launch (torchrun, or
srun-style: tests/distributed/rankutil.py)

PLAN: {"data", "cache", "micro", "global_batch", "seed", "jobs": [{"name", "steps", "save_at": [k...],
       "resume": STATE or null, "allow_change": bool}]}. For each job, rank 0 writes the step-by-step
sample ids gathered over all ranks and micro-steps, the states saved after step k, and the error if
loading the state was refused.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

from rrtrain.data.loader import TrainLoader
from rrtrain.core.dist import exit_process
from rrtrain.core.errors import UsageError


def run_job(plan: dict, job: dict, rank: int, world: int, local_rank: int) -> dict:
    loader = TrainLoader(plan["data"], micro_batch=plan["micro"], global_batch=plan["global_batch"], rank=rank,
                         world_size=world, local_rank=local_rank, seed=plan["seed"],
                         cache_dir=os.path.join(plan["cache"], job["name"]))  # one cache dir per node, as the trainer does
    result: dict = {"steps": [], "states": {}, "error": None}
    if job.get("resume") is not None:
        try:
            loader.load_state_dict(job["resume"], allow_change=job.get("allow_change", False))
        except UsageError as err:
            result["error"] = str(err)
            loader.close()
            return result
    it = iter(loader)
    accum = plan["global_batch"] // (plan["micro"] * world)
    for step in range(1, job["steps"] + 1):
        ids = []
        for _ in range(accum):
            batch = next(it)
            assert tuple(batch.shape) == (plan["micro"], loader.seq_len + 1)
            ids += batch[:, 0].tolist()
        gathered: list = [None] * world
        dist.all_gather_object(gathered, ids)
        result["steps"].append(sorted(i for part in gathered for i in part))
        if step in job.get("save_at", []):
            result["states"][str(step)] = loader.state_dict()
    loader.close()
    return result


def main() -> None:
    plan_path, out_path = sys.argv[1], sys.argv[2]
    with open(plan_path) as f:
        plan = json.load(f)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    results = {job["name"]: run_job(plan, job, rank, world, local_rank) for job in plan["jobs"]}
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()


if __name__ == "__main__":
    main()
    exit_process(0)  # not interpreter shutdown: a gloo thread may still be releasing tensors (see exit_process)

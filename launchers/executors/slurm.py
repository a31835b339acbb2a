"""`--executor slurm`: one submitit job array per resource shape (`map_array`), one task per GPU.

Each array task runs `launchers.executors.entry.RunJob` with the sweep's code snapshot first on PYTHONPATH. A run of
several tasks gets a rendezvous drawn at submission (launchers.torchrun.rendezvous), whose port its ranks meet
at instead of the one submitit derives from the job id, which anyone can see. Time-limit
warnings (USR2, `signal_delay_s` before the limit) and preemptions make the run checkpoint; the entry point
requeues it through submitit, at most `max_requeues` times for time limits (submitit's max_num_timeout).
Returns as soon as the arrays are queued.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any, Optional

from launchers.executors.base import SubmitError, Submitted
from launchers.executors.entry import RunJob, rendezvous_path
from launchers.sweep.expand import Run
from launchers.sweep.job_token import job_mark
from launchers.executors.render import group_runs
from launchers.sweep.snapshot import NO_BYTECODE
from launchers.sweep.spec import Resources
from launchers.torchrun import rendezvous
from rrtrain.core import files
from rrtrain.core.errors import UsageError


def extra_parameters(r: Resources) -> dict[str, Any]:
    """`extra_sbatch` lines (`--key=value` / `--flag`) as submitit's additional parameters, plus --requeue."""
    out: dict[str, Any] = {"requeue": True}
    for extra in r.extra_sbatch:
        key, sep, value = extra.lstrip("-").partition("=")
        out[key.replace("-", "_")] = value if sep else True
    return out


def parameters(r: Resources, name: str, code: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "name": name, "nodes": r.nodes, "tasks_per_node": r.tasks, "cpus_per_task": r.cpus_per_task,
        "mem_gb": r.mem_gb, "timeout_min": r.time_min, "slurm_signal_delay_s": r.signal_delay_s,
        "slurm_array_parallelism": r.array_parallelism, "slurm_additional_parameters": extra_parameters(r),
        "slurm_setup": [f"export PYTHONPATH={shlex.quote(code)}${{PYTHONPATH:+:$PYTHONPATH}}",
                        f"export OMP_NUM_THREADS={r.cpus_per_task}",
                        *(f"export {k}={v}" for k, v in NO_BYTECODE.items())],
    }
    if r.gpus_per_node:
        params["gpus_per_node"] = r.gpus_per_node
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(r, key):
            params[f"slurm_{key}"] = getattr(r, key)
    return params


def submit(runs: list[Run], out: Path, name: str, code: str) -> dict[str, Optional[str]]:
    """Queue every run; returns the job id of each (ARRAY_TASK)."""
    import submitit

    missing = [cmd for cmd in ("sbatch", "srun") if shutil.which(cmd) is None]  # submitit needs both
    if missing:
        raise UsageError(f"--executor slurm: {' and '.join(missing)} not on PATH (no Slurm here); "
                         "try --executor local")
    jobs: dict[str, Optional[str]] = {}
    mark = job_mark(out)  # what --cancel-flagged later asks Slurm for before it cancels a job of this sweep
    for group, members in group_runs(runs).items():
        r = members[0].resources
        executor = submitit.AutoExecutor(folder=str(out / "slurm" / "submitit" / "%j"), cluster="slurm",
                                         slurm_max_num_timeout=r.max_requeues)
        executor.update_parameters(**parameters(r, f"{name}-{group}", code), slurm_comment=mark)
        if r.world_size > 1:  # the ranks' store: a port drawn now, not submitit's (derived from the job id)
            for m in members:
                path = rendezvous_path(out, m.id)
                files.make_dirs(path.parent)
                rendezvous.write(path, rendezvous.draw())
        try:
            submitted = executor.map_array(RunJob(str(out)), [m.id for m in members])
        except Exception as err:
            raise SubmitError(f"sbatch failed for {group} ({err}); it may have submitted anyway: check squeue "
                              "before submitting again", jobs) from err
        for m, job in zip(members, submitted):
            jobs[m.id] = job.job_id
        print(f"[slurm] {group}: array {submitted[0].job_id.split('_')[0]} with {len(members)} runs", flush=True)
    return jobs


class SlurmExecutor:
    """`--executor slurm` behind the one interface (`launchers.executors.base.Executor`): returns once queued."""

    name = "slurm"
    waits = False

    def submit(self, runs: list[Run], sweep_dir: Path, name: str, code: str) -> Submitted:
        return Submitted(submit(runs, sweep_dir, name, code), {})

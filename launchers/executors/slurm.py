"""`--executor slurm`: one submitit job array per resource shape (`map_array`), one task per GPU.

Each array task runs `launchers.executors.entry.RunJob` with the sweep's code snapshot first on PYTHONPATH, once
the first lines of its script have checked the snapshot, the task's config and submitit's payload against what
was submitted (`seal_lines`). A run of several tasks gets a rendezvous drawn at submission
(launchers.torchrun.rendezvous), whose port its ranks meet at instead of the one submitit derives from the job id,
which anyone can see. Time-limit warnings (USR2, `signal_delay_s` before the limit) and preemptions make the run
checkpoint; the entry point requeues it through submitit, at most `max_requeues` times for time limits
(submitit's max_num_timeout).
Returns as soon as the arrays are queued.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

from launchers.executors.base import ArrayTask, Interrupted, SubmitError, Submitted
from launchers.executors.entry import RunJob, config_path, draw_rendezvous, submitit_dir
from launchers.sweep.expand import Run
from launchers.sweep import seal
from launchers.sweep.job_token import job_mark
from launchers.executors.render import group_runs, heredoc
from launchers.sweep.snapshot import NO_BYTECODE
from launchers.sweep.spec import Resources
from rrtrain.core import files
from rrtrain.core.child_python import SHELL_EXPORT
from rrtrain.core.errors import UsageError


def extra_parameters(r: Resources) -> dict[str, Any]:
    """`extra_sbatch` lines (`--key=value` / `--flag`) as submitit's additional parameters, plus --requeue."""
    out: dict[str, Any] = {"requeue": True}
    for extra in r.extra_sbatch:
        key, sep, value = extra.lstrip("-").partition("=")
        out[key.replace("-", "_")] = value if sep else True
    return out


def seal_lines(python: str, code: str, bound: seal.Bound, members: list[tuple[str, Path, Path]],
               sweep_dir: Path) -> list[str]:
    """Lines of the job script (which Slurm keeps from submission) that check, before anything of the sweep
    directory is imported or unpickled, that the code snapshot, the array task's config and submitit's payload
    of the task (`RunJob(sweep_dir)` of its run, launchers.sweep.payload) are what was submitted
    (`launchers.sweep.seal`, run from its text in the script with `python -I`), and hand the config's digest
    to the trainer; a mismatch ends the task with exit status 2 and the run's final.json saying why.
    `members`: (run id, config, run directory) in array order."""
    q = shlex.quote
    cases = [f"    {i}) rrtrain_run=({q(str(config))} {q(bound.configs[rid])} {q(str(run_dir))} {q(rid)});;"
             for i, (rid, config, run_dir) in enumerate(members)]
    return [*heredoc("RRTRAIN_SEAL", seal.inline_source()),
            'case "${SLURM_ARRAY_TASK_ID:-0}" in', *cases,
            '    *) echo "rrtrain: array task ${SLURM_ARRAY_TASK_ID:-} is not one this sweep submitted" >&2; exit 2;;',
            "esac",
            f'{q(python)} -I -c "$RRTRAIN_SEAL" {q(code)} {q(bound.code_sha256)} "${{rrtrain_run[@]:0:3}}" '
            f'{q(str(submitit_dir(sweep_dir)))} {q(str(sweep_dir))} "${{rrtrain_run[3]}}" || exit 2',
            f'export {seal.CONFIG_DIGEST_ENV}="${{rrtrain_run[1]}}"']


def task_seal_lines(python: str, task: ArrayTask, folder: Path) -> list[str]:
    """Lines of an array task's job script that check, before submitit unpickles it, that its payload is the call
    submitted: `task`'s class with exactly its attributes (plain JSON values), called with the task's index
    (`seal.py task`); anything else ends the task with one line and exit status 2."""
    q = shlex.quote
    state = json.dumps(vars(task), sort_keys=True)
    return [*heredoc("RRTRAIN_SEAL", seal.inline_source()),
            f'{q(python)} -I -c "$RRTRAIN_SEAL" task {q(str(folder))} {q(type(task).__module__)} '
            f'{q(type(task).__qualname__)} {q(state)} || exit 2']


def parameters(r: Resources, name: str, code: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "name": name, "nodes": r.nodes, "tasks_per_node": r.tasks, "cpus_per_task": r.cpus_per_task,
        "mem_gb": r.mem_gb, "timeout_min": r.time_min, "slurm_signal_delay_s": r.signal_delay_s,
        "slurm_array_parallelism": r.array_parallelism, "slurm_additional_parameters": extra_parameters(r),
        "slurm_setup": [f"export PYTHONPATH={shlex.quote(code)}${{PYTHONPATH:+:$PYTHONPATH}}",
                        SHELL_EXPORT,  # submitit's `python -u -m submitit.core._submit`, run where sbatch was
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
    bound = seal.bind(code, {m.id: config_path(out, m.id) for m in runs})  # checked by each task at its start
    mark = job_mark(out)  # what --cancel-flagged later asks Slurm for before it cancels a job of this sweep
    for group, members in group_runs(runs).items():
        r = members[0].resources
        executor = submitit.AutoExecutor(folder=str(submitit_dir(out) / "%j"), cluster="slurm",
                                         slurm_max_num_timeout=r.max_requeues)
        params = parameters(r, f"{name}-{group}", code)
        params["slurm_setup"] += seal_lines(sys.executable, code, bound,
                                            [(m.id, config_path(out, m.id), m.dir) for m in members], out)
        executor.update_parameters(**params, slurm_comment=mark)
        if r.world_size > 1:  # the ranks' store: a port drawn now, not submitit's (derived from the job id)
            for m in members:
                draw_rendezvous(out, m.id)
        try:
            submitted = executor.map_array(RunJob(str(out)), [m.id for m in members])
        except Exception as err:
            raise SubmitError(f"sbatch failed for {group} ({err}); it may have submitted anyway: check squeue "
                              "before submitting again", jobs) from err
        for m, job in zip(members, submitted):
            jobs[m.id] = job.job_id
        print(f"[slurm] {group}: array {submitted[0].job_id.split('_')[0]} with {len(members)} runs", flush=True)
    return jobs


def run_array(task: ArrayTask, count: int, folder: Path, label: str, resources: Resources,
              code: str) -> dict[int, Optional[str]]:
    """Tasks 0..count-1 of `task` as one submitit job array (CPU only: `resources`), its files in `folder`; waits for
    every task. A failed task is a SubmitError naming it and its error's last line; Ctrl-C cancels the array."""
    import submitit

    missing = [cmd for cmd in ("sbatch", "srun") if shutil.which(cmd) is None]
    if missing:
        raise UsageError(f"--executor slurm: {' and '.join(missing)} not on PATH (no Slurm here); "
                         "try --executor local")
    files.make_dirs(folder)
    executor = submitit.AutoExecutor(folder=str(Path(folder) / "%j"), cluster="slurm", slurm_max_num_timeout=0)
    params = parameters(resources, label, code)
    params["slurm_additional_parameters"].pop("requeue", None)  # a task that failed is reported, not requeued
    params["slurm_setup"] += task_seal_lines(sys.executable, task, folder)
    executor.update_parameters(**params)
    try:
        submitted = executor.map_array(task, list(range(count)))
    except Exception as err:
        raise SubmitError(f"sbatch failed for {label} ({str(err).splitlines()[0] if str(err) else err}); it may "
                          "have submitted anyway: check squeue", {}) from err
    jobs = {i: job.job_id for i, job in enumerate(submitted)}
    print(f"[slurm] {label}: array {submitted[0].job_id.split('_')[0]} with {count} tasks", flush=True)
    try:
        for i, job in enumerate(submitted):
            try:
                job.result()
            except Exception as err:  # the task's exception, or submitit's word on a job that did not finish
                lines = [line.strip() for line in str(err).splitlines() if line.strip()]
                raise SubmitError(f"{label} task {i} of {count} (job {job.job_id}) failed: "
                                  f"{(lines[-1] if lines else type(err).__name__)[:500]}",
                                  {str(k): v for k, v in jobs.items()}) from None
    except (KeyboardInterrupt, SubmitError) as stop:
        for job in submitted:  # the rest of the array is not left running
            with contextlib.suppress(Exception):
                job.cancel(check=False)
        if isinstance(stop, KeyboardInterrupt):
            raise Interrupted() from None
        raise
    return jobs


class SlurmExecutor:
    """`--executor slurm` behind the one interface (`launchers.executors.base.Executor`): returns once queued.
    `run_array` (`launchers.executors.base.ArrayExecutor`, `rrtrain prep --tasks`) waits, with `resources`."""

    name = "slurm"
    waits = False

    def __init__(self, resources: Optional[Resources] = None, code: Optional[str] = None) -> None:
        self.resources, self.code = resources, code

    def run_array(self, task: ArrayTask, count: int, folder: Path, label: str) -> dict[int, Optional[str]]:
        code = self.code or str(Path(__file__).resolve().parents[2])  # the live code: the caller waits for it
        return run_array(task, count, folder, label, self.resources or Resources(), code)

    def submit(self, runs: list[Run], sweep_dir: Path, name: str, code: str) -> Submitted:
        return Submitted(submit(runs, sweep_dir, name, code), {})

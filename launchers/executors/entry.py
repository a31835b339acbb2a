"""The job entry point submitit runs: one run of a sweep, one task per GPU.

The trainer owns the stop signals while it trains (its handler replaces submitit's): on USR2/TERM it agrees
across ranks at a step boundary, saves collectively and returns 75. This entry point then turns "preempted"
into a requeue through submitit's own protocol (its USR2 handler, called on global rank 0: it checkpoints
this callable, requeues the job within `max_num_timeout` and exits), and turns every other non-zero ending
into an exception, so a failed run is never recorded as a success and a preempted one never as finished.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from launchers.sweep import record, seal
from launchers.torchrun import rendezvous
from rrtrain.core import files
from rrtrain.rundir import lock as runlock
from rrtrain.rundir import readers
from rrtrain.rundir.outcome import EXIT_CODES

PREEMPTED_EXIT = EXIT_CODES["preempted"]
#: how long a non-zero rank waits for rank 0's requeue to end the job step before giving up
REQUEUE_GRACE_S = 120.0


class RunFailed(RuntimeError):
    """The run ended without completing (failed, diverged, stalled, locked by another copy)."""


def config_path(sweep_dir: Path, run_id: str) -> Path:
    return Path(sweep_dir) / "configs" / f"{run_id}.yaml"


def submitit_dir(sweep_dir: Path) -> Path:
    """Where submitit keeps a sweep's jobs: a folder per job (`%j`) holding its payload, `JOB/JOB_submitted.pkl`,
    which the job script checks before submitit unpickles it (launchers.sweep.payload)."""
    return Path(sweep_dir) / "slurm" / "submitit"


def rendezvous_path(sweep_dir: Path, run_id: str) -> Path:
    """Where a sweep draws the port a run of several tasks meets at (mode 600, at submission): read by submitit's
    job (RunJob) and by the multi-node sbatch script alike."""
    return submitit_dir(sweep_dir) / "rendezvous" / f"{run_id}.json"


def draw_rendezvous(sweep_dir: Path, run_id: str) -> Path:
    """Draw a run's rendezvous at submission, the one place a sweep draws one (launchers.torchrun.rendezvous:
    a random port and id, written mode 600, never through a link); its path."""
    path = rendezvous_path(sweep_dir, run_id)
    files.make_dirs(path.parent)
    rendezvous.write(path, rendezvous.draw())
    return path


class RunJob:
    """A picklable callable: `RunJob(sweep_dir)(run_id)` trains that run; submitit requeues it by `checkpoint`.
    Its one attribute is `sweep_dir`: the job script accepts submitit's payload only as exactly this call
    (launchers.sweep.payload), so a field added here is one added there."""

    def __init__(self, sweep_dir: str) -> None:
        self.sweep_dir = str(sweep_dir)

    def __call__(self, run_id: str) -> dict[str, Any]:
        import submitit

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:
            # the torch.distributed env from the scheduler's tasks; devices stay as Slurm gave them (cuda:LOCAL_RANK)
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
            drawn = rendezvous_path(Path(self.sweep_dir), run_id)
            if drawn.exists() or drawn.is_symlink():  # absent for a job an older rrtrain queued: submitit's port
                os.environ["MASTER_PORT"] = str(rendezvous.read(drawn).port)
        term = TermWatch().install() if env.global_rank != 0 else None  # the trainer's own while it trains
        code = train(Path(self.sweep_dir), run_id)
        if wants_requeue(Path(self.sweep_dir), run_id, code):
            requeue(env, run_id, term)
        return outcome(Path(self.sweep_dir), run_id, code)

    def checkpoint(self, run_id: str) -> Any:
        """submitit's hook: requeue the same call (the run resumes from its own checkpoint)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, run_id)


def train(sweep_dir: Path, run_id: str) -> int:
    """Train the run from its config, which must be the file of the digest the job script checked and exported
    (launchers.executors.slurm.seal_lines): the bytes parsed are the ones bound at submission."""
    from rrtrain.config_load import CONFIG_DIGEST_ENV
    from rrtrain.resolve import load
    from rrtrain.train import run

    return run(load(config_path(sweep_dir, run_id), sha256=os.environ.get(CONFIG_DIGEST_ENV) or None))


def run_dir_of(sweep_dir: Path, run_id: str) -> Path:
    rec = record.load(sweep_dir)
    entry = rec.runs.get(run_id) if rec is not None else None
    return Path(entry.dir) if entry is not None else Path(sweep_dir) / run_id


def wants_requeue(sweep_dir: Path, run_id: str, code: int) -> bool:
    """Whether a run that ended with `code` asks submitit to requeue it: launchers.sweep.seal.ending, the rule the
    sbatch scripts follow too (submitit counts the requeues)."""
    return seal.ending(str(run_dir_of(sweep_dir, run_id)), code, None, 0, None) == "requeue"


def outcome(sweep_dir: Path, run_id: str, code: int) -> dict[str, Any]:
    """final.json of a completed run; raises RunFailed for every other ending."""
    run_dir = run_dir_of(sweep_dir, run_id)
    if code == runlock.LOCKED_EXIT:
        raise RunFailed(f"run {run_id}: another copy holds {run_dir}; this copy did not train")
    problems: list[str] = []
    final = readers.read_final(run_dir, problems)
    if code not in (0, EXIT_CODES["paused"]):  # a pause at a rung of a pruned sweep is an ending asked for
        why = final.reason if final else "; ".join(problems)
        raise RunFailed(f"run {run_id} ended {(final.status if final else None) or 'failed'} (exit {code}): {why}")
    return final.raw if final else {}


class TermWatch:
    """SIGTERM on a rank other than 0, outside training (the trainer installs its own handlers over this one and
    puts it back): Slurm's end of the job step when rank 0 requeues the job. submitit's handler only logs it, so
    the task would sit out KillWait until the KILL while the requeued job waits for it; once the rank only waits
    for the requeue, a TERM, seen already or to come, ends the task at once."""

    def __init__(self) -> None:
        self.seen = self.leaving = False

    def install(self) -> "TermWatch":
        signal.signal(signal.SIGTERM, self._on_term)
        return self

    def _on_term(self, signum: int, frame: Any) -> None:
        self.seen = True
        if self.leaving:
            self._leave()

    def leave_on_term(self) -> None:
        self.leaving = True  # first: a TERM from here on leaves in the handler
        if self.seen:
            self._leave()

    @staticmethod
    def _leave() -> None:
        print("rrtrain: SIGTERM while rank 0 requeues the job: this task ends", file=sys.stderr, flush=True)
        raise SystemExit(PREEMPTED_EXIT)


def requeue(env: Any, run_id: str, term: TermWatch | None = None) -> None:
    """Hand a preempted run back to submitit's checkpoint-and-requeue handler; never returns normally."""
    from submitit.core.job_environment import SignalHandler

    sig = env._usr_sig()
    handler = signal.getsignal(sig)
    if env.global_rank != 0:
        (term or TermWatch().install()).leave_on_term()
        time.sleep(REQUEUE_GRACE_S)  # rank 0 requeues; that ends this task too
        raise RunFailed(f"run {run_id} was preempted and not requeued within {REQUEUE_GRACE_S:g} s")
    if not isinstance(getattr(handler, "__self__", None), SignalHandler):
        raise RunFailed(f"run {run_id} was preempted, and this is not a submitit job that can requeue")
    handler(sig, None)  # checkpoints this callable and requeues (exits), or raises UncompletedJobError
    raise RunFailed(f"run {run_id} was preempted and submitit did not requeue it")

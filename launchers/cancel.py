"""Stop the jobs of runs that will never converge, so that no more GPU-hours burn on them.

`rrtrain sweep --cancel-flagged SWEEP_DIR` (or `monitor: {cancel: true}` in the sweep file, acted on by the local
executor while it waits; `rrtrain status` only reads and never cancels) judges every run from its files
(`launchers.state.flags`: stalled, diverged, early_stall) and, for each run still going that carries one of
those flags:

1. writes `RUN/cancelled.json` (why, which flags, when; `rrtrain.rundir.writers.write_cancelled`) first, so
   that nothing requeues the run — the job entry point and `slurm/array.sbatch` look for it before
   requeueing — and a resubmission leaves it alone;
2. stops its job: `scancel` for a Slurm job — only a job id that is one in full (`JOB_ID`), recorded by this
   sweep's submission, and that Slurm reports as this user's job with this sweep directory's mark as its
   comment (`slurm_job_confirmed`, `launchers.sweep.job_token`) — (the run gets TERM, checkpoints at the next step boundary, reads
   the marker and writes a final.json that says stalled or diverged and why: `rrtrain.rundir.outcome`), TERM
   to the lock holder for a run of the local executor, only when the holder proves itself (its pid, start
   time and command line match the lock and it holds the lock open: `rrtrain.rundir.lock.signallable_pid`);
3. records the cancellation and its reason in `sweep.json`.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from launchers.state.flags import CANCEL_FLAGS, judge_sweep, monitor_config, to_cancel
from launchers.sweep import record
from launchers.sweep.job_token import carries_mark
from launchers.sweep.record import SweepRecord
from rrtrain.rundir import lock as runlock
from rrtrain.rundir.points import point_label, read_point
from rrtrain.rundir.readers import read_cancelled
from rrtrain.rundir.writers import write_cancelled


def flagged(sweep_dir: Path, rec: SweepRecord) -> dict[str, dict[str, str]]:
    """Run id -> {flag: why} for the sweep's runs that are still going and should be cancelled."""
    by_dir = {str(Path(e.dir).resolve()): rid for rid, e in rec.runs.items()}
    out: dict[str, dict[str, str]] = {}
    for verdict in to_cancel(judge_sweep(sweep_dir, monitor_config(rec))):
        rid = by_dir.get(str(verdict.path.resolve()))
        if rid is not None and read_cancelled(verdict.path) is None:
            out[rid] = {k: v for k, v in verdict.flags.items() if k in CANCEL_FLAGS}
    return out


#: a Slurm job id as the sweep records it: JOB, or ARRAY_TASK for a task of a job array
JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")


def _user() -> str:
    """This process's user name (from its uid, not from $USER, which anyone can set), else the uid itself."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def slurm_job_confirmed(job: str, sweep_dir: Path, timeout_s: float = 10.0) -> Optional[str]:
    """None when Slurm reports `job` as this user's job carrying `sweep_dir`'s mark as its comment
    (`launchers.sweep.job_token`: an HMAC under the user's key, set at submission, which no record can forge);
    else why it is not to be cancelled, in words. `job` must be a job id in full already (`JOB_ID`)."""
    if shutil.which("squeue") is None:
        return "squeue is not on PATH, so the job cannot be confirmed as this sweep's"
    try:
        proc = subprocess.run(["squeue", "-h", "-r", "-u", _user(), "-j", job, "-o", "%i %k"],
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"squeue failed ({type(err).__name__})"
    rows = [line.split(None, 1) for line in proc.stdout.splitlines()] if proc.returncode == 0 else []
    if not any(len(row) == 2 and row[0] == job and carries_mark(row[1], sweep_dir) for row in rows):
        return (f"Slurm lists no job {job} of user {_user()} that this sweep directory submitted (its comment is "
                "not the sweep's mark)")
    return None


def _stop_slurm_job(job: object, sweep_dir: Path) -> str:
    """scancel one recorded Slurm job once it proved itself (`slurm_job_confirmed`); returns what was done."""
    if not isinstance(job, str) or not JOB_ID.fullmatch(job):
        return f"job not stopped: the recorded job id {str(job)[:40]!r} is not a Slurm job id"
    why = slurm_job_confirmed(job, sweep_dir)
    if why is not None:
        return f"job not stopped: {why}"
    proc = subprocess.run(["scancel", job], capture_output=True, text=True)
    return f"scancel {job}" + ("" if proc.returncode == 0 else f" failed: {proc.stderr.strip()}")


def _stop_job(executor: str, job: Optional[str], run_dir: Path, sweep_dir: Optional[Path] = None) -> str:
    """Stop one run's job (a Slurm job of the sweep in `sweep_dir`, or the local run's lock holder); returns what
    was done."""
    if executor == "slurm" and job:
        if sweep_dir is None:
            return "job not stopped: no sweep directory to confirm it by"
        return _stop_slurm_job(job, sweep_dir)
    pid = runlock.signallable_pid(run_dir)  # pid, start time, command line and the open lock all match
    if pid is None:
        lock = runlock.read(run_dir)
        old = runlock.legacy_holder(lock) if lock is not None else None
        if old is not None:  # an older rrtrain's lock proves too little to signal on
            return (f"not signalled: its run.lock was written by an older rrtrain and cannot prove that pid {old} "
                    "holds it; stop that process yourself")
        return "no live job found"
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError as err:
        return f"SIGTERM to pid {pid} failed: {err.strerror or err}"
    return f"SIGTERM to pid {pid}"


def cancel_flagged(sweep_dir: Path) -> dict[str, str]:
    """Cancel every flagged run of the sweep; returns run id -> reason (empty when none)."""
    sweep_dir = Path(sweep_dir)
    rec = record.load(sweep_dir)
    if rec is None:
        return {}
    targets = flagged(sweep_dir, rec)
    if not targets:
        return {}
    last = rec.last_jobs()
    done: dict[str, str] = {}
    for rid, flags in targets.items():
        entry = rec.runs[rid]
        run_dir = Path(entry.dir)
        reason = "; ".join(f"{name}: {why}" for name, why in sorted(flags.items()))
        write_cancelled(run_dir, reason, sorted(flags))
        executor, job = last.get(rid, ("", None))
        action = _stop_job(executor, job, run_dir, sweep_dir)
        done[rid] = reason
        point = read_point(entry.config)
        at = f" at {point_label(point)}" if point else ""
        print(f"cancelled {rid}{at} ({action}): {reason}", flush=True)
    cancellation: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": done}
    points = {rid: p for rid in done if (p := read_point(rec.runs[rid].config))}
    if points:
        cancellation["points"] = points  # the grid point of each cancelled run

    def add(current: Optional[SweepRecord]) -> SweepRecord:  # re-read under the record's lock
        now = current if current is not None else rec
        now.cancellations.append(cancellation)
        return now

    record.update(sweep_dir, add)
    return done


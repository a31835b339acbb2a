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

It acts only on a sweep directory that is the user's alone (`files.check_private_path`, refused in one line
otherwise), and on each run through its directory's descriptor, opened once from the sweep directory's with no
link followed at any component before the run is judged (`HeldRuns`): what is judged is what gets the marker and
whose lock holder gets the signal, whatever a name on the way leads to by then; a run whose recorded path holds
a link is left alone, said in one line.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from launchers.state.flags import CANCEL_FLAGS, RunVerdict, judge_sweep, monitor_config, read_run, to_cancel
from launchers.sweep import record
from launchers.sweep.job_token import carries_mark
from launchers.sweep.record import SweepRecord
from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.rundir import layout
from rrtrain.rundir import lock as runlock
from rrtrain.rundir.points import point_label, read_point
from rrtrain.rundir.readers import read_cancelled
from rrtrain.rundir.writers import write_cancelled


class HeldRuns(contextlib.AbstractContextManager["HeldRuns"]):
    """The sweep's recorded run directories, each opened once as a descriptor from the sweep directory's, no
    link followed at any component (`files.open_beneath`), before anything is judged: judging reads, and the
    cancellation writes and signals, through that very descriptor (`path`, /proc/self/fd/N), so a link swapped
    into the recorded path meanwhile redirects nothing. A run whose recorded path holds a link (or leads out of
    the sweep directory) is refused in one line and left alone; one with no directory yet is not there to judge.
    Closed on exit."""

    def __init__(self, sweep_dir: Path, rec: SweepRecord) -> None:
        self.fds: dict[str, int] = {}  # run id -> its directory's descriptor
        self.rels: dict[str, str] = {}  # path below the sweep directory -> run id
        root = files.open_root(sweep_dir)
        try:
            for rid, entry in rec.runs.items():
                rel = record.relative_dir(entry.dir, sweep_dir)
                if rel is None:
                    print(f"rrtrain: run {rid} left alone: its directory {entry.dir} is not below {sweep_dir}",
                          file=sys.stderr, flush=True)
                    continue
                try:
                    self.fds[rid] = files.open_beneath(root, rel, directory=True)
                except FileNotFoundError:
                    continue  # not started yet: nothing to judge or stop
                except OSError as err:  # a link on the way (LinkRefused), not a directory, unreadable
                    print(f"rrtrain: run {rid} left alone (neither judged nor stopped): {files.said(err)}",
                          file=sys.stderr, flush=True)
                    continue
                self.rels[Path(rel).as_posix()] = rid
        except BaseException:
            self.close()
            raise
        finally:
            os.close(root)

    def path(self, rid: str) -> Path:
        """A path that names the run's opened directory itself, whatever its recorded name leads to now."""
        return Path(f"/proc/self/fd/{self.fds[rid]}")

    def reader(self, path: Path, root: Path, tail_bytes: int) -> RunVerdict:
        """`judge_sweep`'s reader: a held run is read through its descriptor (its verdict's `path` is that), any
        other run (a peer for the sweep-level flags) by its path."""
        rel = path.relative_to(root).as_posix() if path != root else "."
        rid = self.rels.get(rel)
        if rid is None:
            return read_run(path, root, tail_bytes)
        held = self.path(rid)
        verdict = read_run(held, held, tail_bytes)
        verdict.rel = rel
        return verdict

    def run_of(self, verdict: RunVerdict) -> Optional[str]:
        """The run id of a verdict read through a held descriptor, else None."""
        rid = self.rels.get(verdict.rel)
        return rid if rid is not None and verdict.path == self.path(rid) else None

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def __exit__(self, *exc: object) -> None:
        self.close()


def flagged(sweep_dir: Path, rec: SweepRecord, held: HeldRuns) -> dict[str, dict[str, str]]:
    """Run id -> {flag: why} for the sweep's runs that are still going and should be cancelled, each judged
    through its held descriptor (`HeldRuns`)."""
    out: dict[str, dict[str, str]] = {}
    for verdict in to_cancel(judge_sweep(sweep_dir, monitor_config(rec), reader=held.reader)):
        rid = held.run_of(verdict)
        if rid is not None and read_cancelled(held.path(rid)) is None:
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


def _stop_job(executor: str, job: Optional[str], run_dir: Path | int, sweep_dir: Optional[Path] = None) -> str:
    """Stop one run's job (a Slurm job of the sweep in `sweep_dir`, or the local run's lock holder, read from
    `run_dir`: a path, or the descriptor the run was judged through); returns what was done."""
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
    """Cancel every flagged run of the sweep; returns run id -> reason (empty when none). Refused in one line
    unless the sweep directory is the user's alone (`files.check_private_path`): this writes, signals and
    cancels on the word of what is there."""
    sweep_dir = Path(sweep_dir)
    files.check_private_path(sweep_dir, f"sweep directory {sweep_dir} (--cancel-flagged writes there and stops "
                                        "its runs' jobs)")
    rec = record.load(sweep_dir)
    if rec is None:
        return {}
    last = rec.last_jobs()
    done: dict[str, str] = {}
    failed: list[str] = []
    with HeldRuns(sweep_dir, rec) as held:
        for rid, flags in flagged(sweep_dir, rec, held).items():
            reason = "; ".join(f"{name}: {why}" for name, why in sorted(flags.items()))
            try:  # the judged directory, not what its name leads to now; the marker first, or no signal
                write_cancelled(held.path(rid), reason, sorted(flags))
            except OSError as err:
                failed.append(f"run {rid}: {Path(rec.runs[rid].dir) / layout.CANCELLED} cannot be written "
                              f"({err.strerror or type(err).__name__}), so its job was not stopped")
                continue
            executor, job = last.get(rid, ("", None))
            action = _stop_job(executor, job, held.fds[rid], sweep_dir)
            done[rid] = reason
            point = read_point(rec.runs[rid].config)
            at = f" at {point_label(point)}" if point else ""
            print(f"cancelled {rid}{at} ({action}): {reason}", flush=True)
    if done:
        record_cancellation(sweep_dir, rec, done)
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise UsageError(f"{failed[0]}{more}")
    return done


def record_cancellation(sweep_dir: Path, rec: SweepRecord, done: dict[str, str]) -> None:
    """Add what was cancelled, and why, to sweep.json (under the record's lock)."""
    cancellation: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": done}
    points = {rid: p for rid in done if (p := read_point(rec.runs[rid].config))}
    if points:
        cancellation["points"] = points  # the grid point of each cancelled run

    def add(current: Optional[SweepRecord]) -> SweepRecord:  # re-read under the record's lock
        now = current if current is not None else rec
        now.cancellations.append(cancellation)
        return now

    record.update(sweep_dir, add)


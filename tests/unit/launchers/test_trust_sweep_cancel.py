"""Who may stop a run: `rrtrain status` never does (whatever sweep.json says); `rrtrain sweep --cancel-flagged`
passes to `scancel` only a Slurm job id in full that Slurm lists as this user's job carrying the sweep directory's
mark as its comment (an HMAC under the user's key: `launchers.sweep.job_token`),
and signals only the process that provably holds the run's own lock file (never through a link). Stand-ins
for `scancel` and `squeue` first on PATH record every call; the runs are real processes holding their locks."""

from __future__ import annotations

import json
import os
import pwd
import sys
import time
from pathlib import Path

import pytest

from launchers import cancel
from launchers.sweep import record
from launchers.sweep.job_token import job_mark
from rrtrain.cli import status as status_cli, sweep as sweep_cli
from rrtrain.rundir import lock as runlock
from unit.launchers.test_sweep_cancel import hold_lock, make_sweep
from sweeputil import write_record

FLAGGED = "tiny-review_convex-s0"  # the run make_sweep stalls at the unigram entropy
USER = pwd.getpwuid(os.getuid()).pw_name

SCANCEL = """#!{python}
import json, os, sys
with open(os.environ["STANDIN_LOG"], "a") as fh:
    fh.write(json.dumps(["scancel"] + sys.argv[1:]) + "\\n")
"""

SQUEUE = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STANDIN_LOG"], "a") as fh:
    fh.write(json.dumps(["squeue"] + args) + "\\n")
opt = lambda flag: args[args.index(flag) + 1] if flag in args else None
for jid, name, owner, state, comment in json.load(open(os.environ["STANDIN_JOBS"])):
    if opt("-u") not in (None, owner) or opt("-j") not in (None, jid):
        continue
    print(opt("-o").replace("%i", jid).replace("%j", name).replace("%T", state).replace("%k", comment))
"""


@pytest.fixture
def slurm_standins(tmp_path, monkeypatch):
    """Stand-in `scancel` and `squeue` first on PATH; returns (the jobs file squeue lists, the call log)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scancel", SCANCEL), ("squeue", SQUEUE)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    jobs, log = tmp_path / "jobs.json", tmp_path / "calls.jsonl"
    jobs.write_text("[]")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_JOBS", str(jobs))
    monkeypatch.setenv("STANDIN_LOG", str(log))
    return jobs, log


def calls(log: Path, cmd: str) -> list[list[str]]:
    return [c[1:] for c in map(json.loads, log.read_text().splitlines()) if c[0] == cmd] if log.exists() else []


@pytest.fixture
def kills(monkeypatch):
    """Every os.kill this process makes, recorded instead of sent."""
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


def _stop(procs) -> None:
    for p in procs:
        p.kill()
        p.wait()


def _set_record(sweep: Path, **change) -> None:
    rec = json.loads((sweep / "sweep.json").read_text())
    rec.update(change)
    write_record(sweep, rec)


def test_status_never_cancels_whatever_sweep_json_says(tmp_path, slurm_standins, kills, capsys, monkeypatch):
    jobs, log = slurm_standins
    sweep, procs = make_sweep(tmp_path)
    try:
        # one flagged local run (a live lock holder) and, as a second submission, the same run under Slurm
        rec = json.loads((sweep / "sweep.json").read_text())
        _set_record(sweep, cancel_flagged=True,
                    submissions=rec["submissions"] + [{"executor": "slurm", "jobs": {FLAGGED: "41_0"}}])
        jobs.write_text(json.dumps([["41_0", "cancel-tiny", USER, "RUNNING", job_mark(sweep)]]))
        assert status_cli.main([str(sweep)]) == 0
        assert status_cli.main([str(sweep), "--json"]) == 0
        assert FLAGGED in capsys.readouterr().out
        assert calls(log, "scancel") == [] and kills == [], "rrtrain status cancelled a run"
        assert not (sweep / FLAGGED / "cancelled.json").exists()
        assert "cancellations" not in json.loads((sweep / "sweep.json").read_text())
        # the command whose name says it acts does cancel
        assert sweep_cli.main(["--cancel-flagged", str(sweep)]) == 0
        assert calls(log, "scancel") == [["41_0"]]
        assert (sweep / FLAGGED / "cancelled.json").exists()
    finally:
        monkeypatch.undo()  # os.kill again, to end the stand-in runs
        _stop(procs.values())


def _listed(job: str, sweep: Path, tmp_path: Path) -> list:
    """What squeue lists for each case of the test below (the sweep is `sweep`; `tmp_path/other` another)."""
    ours, other = job_mark(sweep), job_mark(tmp_path / "other")
    return {
        "--me": [],                                                     # an option, not a job id
        "123 --user=x": [["123", "cancel-tiny", USER, "RUNNING", ours]],  # a job id and more
        "123\n": [["123", "cancel-tiny", USER, "RUNNING", ours]],
        "123_": [["123_", "cancel-tiny", USER, "RUNNING", ours]],
        "77": [],                                                       # not in the queue (another user's, or gone)
        "78": [["78", "cancel-tiny", "someone-else", "RUNNING", ours]],   # another user's job
        "79": [["79", "cancel-tiny", USER, "RUNNING", ""]],             # the sweep's name, no mark: not submitted by it
        "80_2": [["80_2", "cancel-tiny", USER, "RUNNING", other]],       # another sweep's job (its mark, read from squeue)
        "81": [["81", "cancel-tiny", USER, "RUNNING", "rrtrain:" + "0" * 40]],  # a forged mark
    }[job]


@pytest.mark.parametrize("job", ["--me", "123 --user=x", "123\n", "123_", "77", "78", "79", "80_2", "81"])
def test_a_job_id_that_does_not_prove_itself_is_never_passed_to_scancel(tmp_path, slurm_standins, job):
    jobs, log = slurm_standins
    sweep = tmp_path / "sweep"
    jobs.write_text(json.dumps(_listed(job, sweep, tmp_path)))
    action = cancel._stop_job("slurm", job, tmp_path, sweep)
    assert action.startswith("job not stopped"), action
    assert calls(log, "scancel") == []


def test_a_confirmed_job_of_this_sweep_is_cancelled(tmp_path, slurm_standins):
    jobs, log = slurm_standins
    sweep = tmp_path / "sweep"
    jobs.write_text(json.dumps([["55_0", "cancel-small+tiny", USER, "RUNNING", job_mark(sweep)]]))
    assert cancel._stop_job("slurm", "55_0", tmp_path, sweep) == "scancel 55_0"
    assert calls(log, "scancel") == [["55_0"]]
    assert ["-h", "-r", "-u", USER, "-j", "55_0", "-o", "%i %k"] in calls(log, "squeue")


def test_the_mark_is_the_users_alone(tmp_path, monkeypatch):
    """The key behind the mark: made 0600 in a 0700 directory; a key directory others may read is refused in one
    line, and another key (another user's) gives another mark."""
    from rrtrain.core.errors import UsageError

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    mark = job_mark(tmp_path / "sweep")
    key_file = next((tmp_path / "config" / "rrtrain").iterdir())
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "config" / "rrtrain").stat().st_mode & 0o777) == "0o700"
    assert job_mark(tmp_path / "sweep") == mark and job_mark(tmp_path / "other") != mark
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config2"))
    assert job_mark(tmp_path / "sweep") != mark
    (tmp_path / "config2" / "rrtrain").chmod(0o755)
    with pytest.raises(UsageError, match="cannot hold the key"):
        job_mark(tmp_path / "sweep")


@pytest.fixture
def two_runs(tmp_path):
    """Two run directories, each with a live process holding its lock as a training run does."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    procs = {"a": hold_lock(a), "b": hold_lock(b)}
    yield a, b, procs
    _stop(procs.values())


def _points_at_b(kind: str, a: Path, b: Path) -> Path:
    """Run a made to name run b's lock holder: `kind` of link (or copy) in place of a's lock or directory;
    returns the run directory to cancel."""
    lock_a, lock_b = a / runlock.LOCK_NAME, b / runlock.LOCK_NAME
    if kind == "run_dir_symlink":
        link = a.parent / "a-link"
        link.symlink_to(b, target_is_directory=True)
        return link
    lock_a.unlink()
    if kind == "lock_symlink":
        lock_a.symlink_to(lock_b)
    elif kind == "lock_hardlink":
        os.link(lock_b, lock_a)
    else:  # a copy: every word of b's lock, but another file
        lock_a.write_bytes(lock_b.read_bytes())
    return a


@pytest.mark.parametrize("kind", ["lock_symlink", "run_dir_symlink", "lock_hardlink", "copy"])
def test_no_signal_reaches_another_runs_process(two_runs, kind):
    a, b, procs = two_runs
    target = _points_at_b(kind, a, b)
    assert runlock.signallable_pid(target) is None
    assert not cancel._stop_job("local", None, target).startswith("SIGTERM")
    time.sleep(0.2)
    assert procs["b"].poll() is None, "run b's process was signalled through run a's lock"
    if kind != "lock_hardlink":  # a lock file with a second name proves nothing, even in its own run
        assert runlock.signallable_pid(b) == procs["b"].pid  # b's own lock still proves its holder


def test_a_lock_of_the_same_inode_on_another_device_proves_nothing(two_runs, monkeypatch):
    a, b, procs = two_runs
    info = runlock.read(b)
    dev, ino, _ = info["lock_id"]
    real = runlock._read_beneath
    monkeypatch.setattr(runlock, "_read_beneath",  # b's lock as if it were another device's file, same inode
                        lambda d: {**real(d), "lock_id": [dev + 1, ino, 1]})
    assert runlock.signallable_pid(b) is None
    monkeypatch.setattr(runlock, "_read_beneath", real)
    assert runlock.signallable_pid(b) == procs["b"].pid

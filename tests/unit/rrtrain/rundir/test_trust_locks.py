"""Locks that prove themselves: a run lock is honoured, waited on or signalled only when its pid, start time
and command line match a live process that holds the lock's flock; an empty, unparsable or wrong-typed lock
never blocks forever and never raises a traceback (waited on while fresh, taken over once stale, with a line
on stderr). The processes are real: `sleep` for a live process that is not rrtrain, a Python process holding
a `RunLock` for a live run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchers import cancel
from rrtrain.rundir import lock as runlock

HOLD = ("import sys, time; from rrtrain.rundir.lock import RunLock; RunLock(sys.argv[1]).acquire(0); "
        "print('held', flush=True); time.sleep(120)")


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def holder(tmp_path):
    """A live process holding `tmp_path/held`'s lock, as a training run does."""
    run_dir = tmp_path / "held"
    run_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield run_dir, proc
    proc.kill()
    proc.wait()


def _age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


def _write_lock(run_dir: Path, content: object) -> Path:
    path = run_dir / runlock.LOCK_NAME
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_a_live_process_that_is_not_rrtrain_is_never_signalled(tmp_path, sleeper):
    # the pid alone (no start time): cancel's local path must not SIGTERM it, and the lock is not honoured
    _write_lock(tmp_path, {"host": socket.gethostname(), "pid": sleeper.pid})
    assert runlock.signallable_pid(tmp_path) is None
    assert cancel._stop_job("local", None, tmp_path) == "no live job found"
    # a forged lock that copies everything /proc shows of the process (start time, command line) proves
    # nothing either: the process does not hold the lock file's flock
    _write_lock(tmp_path, {"host": socket.gethostname(), "pid": sleeper.pid,
                           "pid_start": runlock._start_time(sleeper.pid), "cmdline": runlock._cmdline(sleeper.pid)})
    assert not runlock.holder_alive(runlock.read(tmp_path))
    assert cancel._stop_job("local", None, tmp_path) == "no live job found"
    time.sleep(0.2)
    assert sleeper.poll() is None, "a process that is not an rrtrain run was signalled"
    runlock.RunLock(tmp_path).acquire(0).release()  # and its lock is taken over at once


def test_a_live_holder_is_honoured_and_signallable(holder):
    run_dir, proc = holder
    info = runlock.read(run_dir)
    assert info["pid"] == proc.pid and info["cmdline"][:2] == [sys.executable, "-c"]
    assert runlock.holder_alive(info) and runlock.signallable_pid(run_dir) == proc.pid
    with pytest.raises(runlock.RunLocked, match=f"pid {proc.pid}"):
        runlock.RunLock(run_dir).acquire(0)
    assert cancel._stop_job("local", None, run_dir) == f"SIGTERM to pid {proc.pid}"
    assert proc.wait(timeout=10) == -15


def test_a_holder_with_another_command_line_is_not_honoured(holder):
    """A reused pid: alive, but not the process that wrote the lock."""
    run_dir, proc = holder
    info = json.loads((run_dir / runlock.LOCK_NAME).read_text())
    (run_dir / runlock.LOCK_NAME).write_text(json.dumps({**info, "cmdline": ["python", "-m", "something.else"]}))
    assert runlock.signallable_pid(run_dir) is None and not runlock.holder_alive(runlock.read(run_dir))
    assert proc.poll() is None


@pytest.mark.parametrize("content", ["", "{\"host\": \"x\", \"pi", "[1, 2]", "\"a string\"", "3", "null"])
def test_a_lock_that_names_no_holder_is_waited_on_then_taken_over(tmp_path, capfd, content):
    path = _write_lock(tmp_path, content)
    with pytest.raises(runlock.RunLocked, match="names no holder yet"):  # fresh: maybe being written
        runlock.RunLock(tmp_path).acquire(0.6)
    _age(path, runlock.STALE_S + 5)
    lock = runlock.RunLock(tmp_path).acquire(0)  # stale: taken over, at once
    assert runlock.read(tmp_path)["nonce"] == lock.nonce
    err = capfd.readouterr().err
    assert f"taking over {path}" in err and "names no holder" in err
    lock.release()


@pytest.mark.parametrize("fields", [
    {"host": socket.gethostname(), "pid": [1], "pid_start": 5, "cmdline": "x"},
    {"host": socket.gethostname(), "pid": "1e999", "started": "yesterday", "job_id": {"a": 1}},
    {"host": socket.gethostname(), "pid": 2**70},
])
def test_a_lock_with_wrong_field_types_is_taken_over_without_a_traceback(tmp_path, capfd, fields):
    _write_lock(tmp_path, fields)
    runlock.RunLock(tmp_path).acquire(0).release()
    assert "is not a live rrtrain process" in capfd.readouterr().err


def test_a_lock_left_by_a_failed_write_is_removed(tmp_path, monkeypatch):
    """A full disk between the lock's creation and its write leaves no empty lock behind."""
    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runlock.os, "write", full)
    with pytest.raises(OSError):
        runlock.RunLock(tmp_path).acquire(0)
    assert not (tmp_path / runlock.LOCK_NAME).exists()


def test_a_filesystem_without_flock_still_locks_by_identity(tmp_path, monkeypatch):
    """Lustre mounted without flock refuses it: the lock says so, a live holder is still honoured on its
    pid, start time and command line, and without the flock proof nothing signals it."""
    real = runlock.fcntl.flock

    def no_flock(fd, op):  # noqa: ANN001
        if op & runlock.fcntl.LOCK_EX and op & runlock.fcntl.LOCK_NB:
            raise OSError(38, "Function not implemented")
        return real(fd, op)

    monkeypatch.setattr(runlock.fcntl, "flock", no_flock)
    held = runlock.RunLock(tmp_path).acquire(0)
    info = runlock.read(tmp_path)
    assert info["flock"] is False and runlock.holder_alive(info)
    assert runlock.signallable_pid(tmp_path) is None
    with pytest.raises(runlock.RunLocked):
        runlock.RunLock(tmp_path).acquire(0)
    held.release()


def test_a_remote_lock_with_an_impossible_start_time_is_described_without_a_traceback(tmp_path):
    _write_lock(tmp_path, "{\"host\": \"another-node\", \"pid\": 7, \"started\": 1e300, \"job_id\": [1]}")
    with pytest.raises(runlock.RunLocked, match="host another-node pid 7"):
        runlock.RunLock(tmp_path).acquire(0)  # a fresh heartbeat from another host: honoured


# What an rrtrain older than command lines in locks did while it held a run: a lock of host, pid, start time,
# job and nonce, written once and closed (no flock), its mtime touched as a heartbeat. Its command line names
# rrtrain.train, as `python -m rrtrain.train` does.
OLD_HOLDER = """
import json, os, socket, sys, time, uuid
from rrtrain.rundir.lock import _start_time
path = os.path.join(sys.argv[2], "run.lock")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _start_time(os.getpid()),
                         "job_id": None, "started": time.time(), "nonce": uuid.uuid4().hex}).encode())
os.close(fd)
print("held", flush=True)
while True:
    time.sleep(0.2)
    os.utime(path)
"""


@pytest.fixture
def old_holder(tmp_path):
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", OLD_HOLDER, "rrtrain.train", str(run_dir)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield run_dir, proc
    proc.kill()
    proc.wait()


def test_an_older_rrtrains_lock_is_honoured_while_its_holder_lives_and_never_signalled(old_holder, capfd):
    run_dir, proc = old_holder
    info = runlock.read(run_dir)
    assert runlock.is_legacy(info) and runlock.holder_alive(info) and runlock.signallable_pid(run_dir) is None
    with pytest.raises(runlock.RunLocked, match="written by an older rrtrain") as refused:
        runlock.RunLock(run_dir).acquire(0.3)
    assert f"pid {proc.pid}" in str(refused.value) and "\n" not in str(refused.value)
    said = cancel._stop_job("local", None, run_dir)
    assert said.startswith("not signalled") and f"pid {proc.pid}" in said
    time.sleep(0.2)
    assert proc.poll() is None, "an older rrtrain's lock proves too little to signal its pid"
    proc.kill()
    proc.wait()
    lock = runlock.RunLock(run_dir).acquire(0)  # its holder is gone: taken over at once, and said
    assert "a lock of an older rrtrain" in capfd.readouterr().err
    lock.release()


def test_an_older_lock_proves_itself_only_by_a_live_rrtrain_pid_its_start_time_and_a_heartbeat(
        old_holder, sleeper, tmp_path, capfd):
    _, proc = old_holder
    me = {"host": socket.gethostname(), "job_id": None, "started": time.time(), "nonce": "n"}
    cases = {  # each names a live process; only the first is an rrtrain run's
        "fresh": ({**me, "pid": proc.pid, "pid_start": runlock._start_time(proc.pid)}, 0, True),
        "stale heartbeat": ({**me, "pid": proc.pid, "pid_start": runlock._start_time(proc.pid)},
                            runlock.STALE_S + 5, False),
        "another start time": ({**me, "pid": proc.pid, "pid_start": "1"}, 0, False),
        "not rrtrain": ({**me, "pid": sleeper.pid, "pid_start": runlock._start_time(sleeper.pid)}, 0, False),
    }
    for name, (content, age, honoured) in cases.items():
        run_dir = tmp_path / name.replace(" ", "-")
        run_dir.mkdir()
        _age(_write_lock(run_dir, content), age)
        assert runlock.holder_alive(runlock.read(run_dir)) is honoured, name
        assert runlock.signallable_pid(run_dir) is None, name
        if not honoured:
            runlock.RunLock(run_dir).acquire(0).release()
            assert "a lock of an older rrtrain" in capfd.readouterr().err, name
    assert proc.poll() is None and sleeper.poll() is None


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_run_lock_that_is_not_a_file_is_refused_in_one_line_and_left_alone(tmp_path, kind):
    path = tmp_path / runlock.LOCK_NAME
    {"fifo": lambda: os.mkfifo(path), "directory": path.mkdir,
     "symlink": lambda: path.symlink_to(tmp_path / "elsewhere")}[kind]()
    from rrtrain.core.errors import UsageError

    with pytest.raises(UsageError, match="not a lock file rrtrain wrote") as refused:
        runlock.RunLock(tmp_path).acquire(5)  # at once: nothing to wait for
    assert "\n" not in str(refused.value)
    assert os.path.lexists(path) and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_take_over_guard_that_is_not_a_file_is_refused_without_waiting_or_writing_through(tmp_path, kind):
    """The guard under which a stale lock is taken over: a FIFO there would block the opener for good, a link
    would create a file wherever it points."""
    from rrtrain.core.errors import UsageError

    guard = tmp_path / f".{runlock.LOCK_NAME}.guard"
    os.mkfifo(guard) if kind == "fifo" else guard.symlink_to(tmp_path / "planted")
    _age(_write_lock(tmp_path, ""), runlock.STALE_S + 5)  # stale: a take-over is due
    with pytest.raises(UsageError, match="not the guard file rrtrain makes"):
        runlock.RunLock(tmp_path).acquire(0)
    assert os.path.lexists(guard) and not (tmp_path / "planted").exists()

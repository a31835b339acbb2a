"""One writer per sweep directory (launchers.sweep.lock): a second `rrtrain sweep` waits, bounded, then refuses
naming the holder; sweep.json's read-modify-writes never lose another process's entries; a planted link is
never followed; a code snapshot is never deleted. The two real concurrent sweeps are
tests/e2e/test_sweep_lock_local.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launchers.sweep import record, snapshot, lock as sweep_lock
from rrtrain.core.errors import UsageError
from sweeputil import write_record

HOLD = """
import fcntl, json, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "host": "elsewhere", "started": time.time()}).encode())
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def holding(path: Path, seconds: float) -> subprocess.Popen:
    """Another process holding the flock on `path` for `seconds`."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_submission_waits_then_refuses_naming_the_holder(tmp_path, capsys):
    other = holding(tmp_path / sweep_lock.SWEEP_LOCK, 30)
    try:
        t0 = time.monotonic()
        with pytest.raises(UsageError) as err:
            with sweep_lock.hold_sweep(tmp_path, wait_s=0.6):
                pytest.fail("the lock was taken while another process held it")
        waited = time.monotonic() - t0
        assert waited >= 0.6  # refused at its deadline on the clock it waits on, not before
        assert waited < 120  # only a wait that never ends fails here
        assert f"pid {other.pid} on elsewhere" in str(err.value) and "after 0.6 s (--lock-wait)" in str(err.value)
        assert "\n" not in str(err.value)
        assert "waiting up to 0.6 s" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()


def test_the_lock_is_taken_once_the_holder_ends_however_it_ends(tmp_path):
    other = holding(tmp_path / sweep_lock.SWEEP_LOCK, 0.5)
    with sweep_lock.hold_sweep(tmp_path, wait_s=30):
        assert other.poll() is not None  # only once the other process had ended
        holder = json.loads((tmp_path / sweep_lock.SWEEP_LOCK).read_text())
        assert holder["pid"] == os.getpid()
    other = holding(tmp_path / sweep_lock.SWEEP_LOCK, 30)
    other.kill()  # killed hard: the kernel drops its lock
    other.wait()
    with sweep_lock.hold_sweep(tmp_path, wait_s=0):
        pass


def test_a_planted_link_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / sweep_lock.SWEEP_LOCK).symlink_to(victim)
    with pytest.raises(UsageError, match="is a symbolic link: move it away"):
        with sweep_lock.hold_sweep(sweep):
            pass
    assert victim.read_text() == "precious"
    os.mkfifo(sweep / sweep_lock.RECORD_LOCK)
    with pytest.raises(UsageError, match="not a regular file"):
        record.update(sweep, lambda rec: rec)


def test_concurrent_record_updates_lose_no_entry(tmp_path):
    write_record(tmp_path, {"version": 1, "name": "s", "runs": {}, "submissions": []})
    writers = [threading.Thread(target=lambda i=i: [record.record_submission(tmp_path, record.SweepRecord("s"), "local", {f"r{i}": f"job{i}.{k}"})
                                                 for k in range(10)]) for i in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    jobs = [job for sub in record.load(tmp_path).submissions for job in sub.jobs.values()]
    assert sorted(jobs) == sorted(f"job{i}.{k}" for i in range(4) for k in range(10))


def test_a_submission_keeps_the_cancellations_recorded_meanwhile(tmp_path):
    write_record(tmp_path, {"version": 1, "name": "s", "runs": {}, "submissions": []})
    mine = record.load(tmp_path)
    record.update(tmp_path, lambda rec: dataclasses.replace(rec, cancellations=[{"runs": {"r": "stalled"}}]))  # `status`, meanwhile
    record.update(tmp_path, record.keep_cancellations(dataclasses.replace(mine, sweep_sha256="new")))
    rec = record.load(tmp_path)
    assert rec.sweep_sha256 == "new" and rec.cancellations == [{"runs": {"r": "stalled"}}]


def test_a_snapshot_is_reused_or_taken_beside_never_deleted(tmp_path):
    first = snapshot.take(tmp_path, None)
    assert first["path"] == str((tmp_path / "code").resolve()) and first["sha256"] == snapshot.code_hash()
    marker = tmp_path / "code" / "rrtrain" / "in_use.txt"
    again = snapshot.take(tmp_path, None)  # sweep.json lost or never written: the same code is reused
    assert again["path"] == first["path"]
    marker.write_text("a run imports from here")  # now `code` holds other code than this checkout
    other = snapshot.take(tmp_path, None)
    assert other["path"] == str((tmp_path / f"code-{snapshot.code_hash()[:12]}").resolve())
    assert marker.read_text() == "a run imports from here"  # never deleted
    assert snapshot.take(tmp_path, other) == other
    assert not list(tmp_path.glob(".code.tmp*"))

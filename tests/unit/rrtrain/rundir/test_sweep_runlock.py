"""The run-directory lock: bounded wait for a live holder, take-over of a dead one, release only one's own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rrtrain.rundir import lock as runlock


def test_second_copy_waits_then_gives_up(tmp_path):
    first = runlock.RunLock(tmp_path).acquire(0)
    t0 = time.monotonic()
    with pytest.raises(runlock.RunLocked, match=rf"locked by host {socket.gethostname()} pid {os.getpid()}.*"
                                                r"waited 1 s \(run.lock_wait_s\)"):
        runlock.RunLock(tmp_path).acquire(1.0)
    waited = time.monotonic() - t0
    assert waited >= 1.0  # gave up at its deadline on the clock it waits on, not before: no load can shorten it
    assert waited < 120  # only a wait that never ends fails here
    first.release()
    assert not (tmp_path / runlock.LOCK_NAME).exists()
    runlock.RunLock(tmp_path).acquire(0).release()


def test_dead_holder_is_taken_over(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(proc.stdout)
    (tmp_path / runlock.LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead, "nonce": "x"}))
    lock = runlock.RunLock(tmp_path).acquire(0)
    assert runlock.read(tmp_path)["pid"] == os.getpid()
    lock.release()


def test_silent_remote_holder_is_stale_but_a_fresh_one_is_not(tmp_path):
    path = tmp_path / runlock.LOCK_NAME
    path.write_text(json.dumps({"host": "another-node", "pid": 1, "nonce": "x"}))
    with pytest.raises(runlock.RunLocked, match="another-node"):
        runlock.RunLock(tmp_path).acquire(0)  # heartbeat fresh: alive
    old = time.time() - 2 * runlock.STALE_S
    os.utime(path, (old, old))
    runlock.RunLock(tmp_path).acquire(0).release()


def test_release_leaves_another_holders_lock(tmp_path):
    mine = runlock.RunLock(tmp_path).acquire(0)
    (tmp_path / runlock.LOCK_NAME).write_text(json.dumps({"host": "h", "pid": 1, "nonce": "someone-else"}))
    mine.release()
    assert runlock.read(tmp_path)["nonce"] == "someone-else"

"""Host-wide state is the user's own, and every lock wait ends (`rrtrain.core.host_locks`)."""

from __future__ import annotations

import fcntl
import os
import stat

import pytest

from rrtrain.core.errors import RunError, UsageError
from rrtrain.core.host_locks import (DEFAULT_LOCK_WAIT_S, LOCK_WAIT_ENV, LockTimeout, flock_within, lock_wait_s,
                                     open_private_lock, private_runtime_dir)


def test_the_private_directory_is_made_0700_and_reused(tmp_path):
    made = private_runtime_dir(str(tmp_path))
    assert made == str(tmp_path / f"rrtrain-{os.geteuid()}")
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    assert private_runtime_dir(str(tmp_path)) == made


@pytest.mark.parametrize("plant", ["link", "file", "other_owner", "group_writable", "world_readable"])
def test_a_private_directory_someone_else_could_have_made_is_refused(tmp_path, plant):
    """Its name is predictable: a co-tenant may have made it first, to read or hold what rrtrain puts there."""
    path = tmp_path / f"rrtrain-{os.geteuid()}"
    if plant == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    elif plant == "file":
        path.write_text("")
    else:
        path.mkdir(mode=0o700)
        if plant == "other_owner":
            os.chown(path, os.geteuid() + 12345, -1)
        else:
            os.chmod(path, 0o770 if plant == "group_writable" else 0o705)
    with pytest.raises(UsageError) as err:
        private_runtime_dir(str(tmp_path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
def test_a_lock_planted_in_the_private_directory_is_refused(tmp_path, plant):
    directory = private_runtime_dir(str(tmp_path))
    lock = os.path.join(directory, "some.lock")
    os.mkfifo(lock) if plant == "fifo" else os.symlink(tmp_path / "elsewhere", lock)
    with pytest.raises(UsageError, match="some.lock"):
        open_private_lock("some.lock", str(tmp_path))
    assert not (tmp_path / "elsewhere").exists()


def test_a_lock_file_is_the_users_alone(tmp_path):
    old = os.umask(0o002)  # a shared project directory's umask
    try:
        with open_private_lock("some.lock", str(tmp_path)) as handle:
            assert stat.S_IMODE(os.fstat(handle.fileno()).st_mode) == 0o600
    finally:
        os.umask(old)


def test_a_held_lock_is_refused_within_its_deadline(tmp_path):
    with open_private_lock("some.lock", str(tmp_path)) as holder, open_private_lock("some.lock", str(tmp_path)) as me:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another open file: as another process holds it
        with pytest.raises(LockTimeout) as err:
            flock_within(me, "the test's lock", wait_s=0.2)
        assert isinstance(err.value, RunError)
        assert "the test's lock" in str(err.value) and LOCK_WAIT_ENV in str(err.value)
        fcntl.flock(holder, fcntl.LOCK_UN)
        flock_within(me, "the test's lock", wait_s=0.2)  # free: taken at once


def test_the_wait_is_one_setting(monkeypatch):
    monkeypatch.delenv(LOCK_WAIT_ENV, raising=False)
    assert lock_wait_s() == DEFAULT_LOCK_WAIT_S
    monkeypatch.setenv(LOCK_WAIT_ENV, "2.5")
    assert lock_wait_s() == 2.5
    for bad in ("soon", "0", "-1", "inf", "nan"):
        monkeypatch.setenv(LOCK_WAIT_ENV, bad)
        with pytest.raises(UsageError, match=LOCK_WAIT_ENV):
            lock_wait_s()


def test_the_streaming_lock_is_per_user_and_its_wait_ends(tmp_path, monkeypatch):
    """The machine's streaming lock: this user's, 0600, in the private directory; held past the deadline, every
    open of a dataset is refused in one line."""
    from rrtrain.data import shm

    with shm.open_machine_lock() as real:
        assert os.path.dirname(os.readlink(f"/proc/self/fd/{real.fileno()}")) == private_runtime_dir()
        assert stat.S_IMODE(os.fstat(real.fileno()).st_mode) == 0o600
    monkeypatch.setattr(shm, "SHM_LOCK", str(tmp_path / "streaming.lock"))  # the test's own: others go on
    monkeypatch.setenv(LOCK_WAIT_ENV, "0.2")
    with open(tmp_path / "streaming.lock", "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(LockTimeout, match="streaming lock .*streaming.lock"):
            with shm.shm_guard():
                pytest.fail("the guard was entered")


def test_a_held_take_over_guard_of_a_run_lock_is_refused_within_its_deadline(tmp_path, monkeypatch):
    """The guard under which a stale run.lock is taken over: held by a wedged process, the next start of the
    run is refused in one line once the wait's deadline passes, rather than hanging."""
    from rrtrain.rundir import lock as runlock

    monkeypatch.setenv(LOCK_WAIT_ENV, "0.2")
    (tmp_path / runlock.LOCK_NAME).write_text("")  # names no holder: to be taken over, under the guard
    with open(tmp_path / f".{runlock.LOCK_NAME}.guard", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        with pytest.raises(LockTimeout, match="take-over guard"):
            runlock.RunLock(tmp_path)._take_over(None, None, "the test")

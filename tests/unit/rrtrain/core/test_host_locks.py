"""Host-wide state is the user's own, and every lock wait ends (`rrtrain.core.host_locks`)."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import socket
import stat
from concurrent.futures import ProcessPoolExecutor

import pytest

from rrtrain.core.errors import RunError, UsageError
from rrtrain.core.host_locks import (DEFAULT_LOCK_WAIT_S, LOCK_WAIT_ENV, RUNTIME_DIR_ENV, LockTimeout, flock_within,
                                     lock_wait_s, open_private_lock, private_runtime_dir)

OTHER_UID = os.geteuid() + 12345  # another user of the node


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    """A home of the test's own, where a redirect is recorded (never the real ~/.rrtrain)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(RUNTIME_DIR_ENV, raising=False)
    return tmp_path / "home"


def test_the_private_directory_is_made_0700_and_reused(tmp_path):
    made = private_runtime_dir(str(tmp_path))
    assert made == str(tmp_path / f"rrtrain-{os.geteuid()}")
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    assert private_runtime_dir(str(tmp_path)) == made


@pytest.mark.parametrize("plant", ["link", "file", "group_writable", "world_readable"])
def test_a_private_directory_of_the_users_that_is_not_private_is_refused(tmp_path, plant):
    """Only the user (or root) can have made a name that is the user's: rrtrain makes it 0700, so one that is
    not is refused in one line rather than used or changed."""
    path = tmp_path / f"rrtrain-{os.geteuid()}"
    if plant == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    elif plant == "file":
        path.write_text("")
    else:
        path.mkdir(mode=0o700)
        os.chmod(path, 0o770 if plant == "group_writable" else 0o705)
    with pytest.raises(UsageError) as err:
        private_runtime_dir(str(tmp_path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def plant_as_another_user(path, plant: str) -> None:
    """What a co-tenant leaves at the predictable name: their directory, file or link (any mode)."""
    if plant == "dir":
        path.mkdir(mode=0o700)
    elif plant == "file":
        path.write_text("")
    else:
        path.symlink_to("/nonexistent")
    os.lchown(path, OTHER_UID, -1)


@pytest.mark.parametrize("plant", ["dir", "file", "link"])
def test_a_name_another_user_took_first_stops_nothing(tmp_path, own_home, plant):
    """A co-tenant who makes `rrtrain-<uid>` first used to fail every run of the user on the node (the user
    cannot remove it): now the user's processes take a fresh 0700 directory beside it, the same one each time,
    recorded in the user's own ~/.rrtrain/hosts/<host>/; the co-tenant's name is left as it is."""
    taken = tmp_path / f"rrtrain-{os.geteuid()}"
    plant_as_another_user(taken, plant)
    made = private_runtime_dir(str(tmp_path))
    assert made != str(taken) and os.path.dirname(made) == str(tmp_path)
    st = os.lstat(made)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    pointer = own_home / ".rrtrain" / "hosts" / socket.gethostname() / taken.name
    assert pointer.read_text().strip() == made and stat.S_IMODE(pointer.stat().st_mode) == 0o600
    assert private_runtime_dir(str(tmp_path)) == made  # every later process of the user: the same directory
    assert os.lstat(taken).st_uid == OTHER_UID  # theirs, untouched
    with open_private_lock("some.lock", str(tmp_path)) as handle:
        assert os.path.dirname(os.readlink(f"/proc/self/fd/{handle.fileno()}")) == made


def test_a_stale_record_is_replaced(tmp_path, own_home):
    """The recorded directory gone (a reboot empties /dev/shm) or no longer the user's private one: a new one."""
    plant_as_another_user(tmp_path / f"rrtrain-{os.geteuid()}", "dir")
    first = private_runtime_dir(str(tmp_path))
    os.rmdir(first)
    second = private_runtime_dir(str(tmp_path))
    assert second != first and os.path.isdir(second)
    os.chown(second, OTHER_UID, -1)  # someone else's now
    third = private_runtime_dir(str(tmp_path))
    assert third not in (first, second) and os.lstat(third).st_uid == os.geteuid()


def _runtime_dir_of_a_process(root: str) -> str:
    return private_runtime_dir(root)


def test_every_process_of_the_user_agrees_on_the_redirect(tmp_path):
    """The shared-memory guard's locks live there: processes starting together must all take one directory."""
    plant_as_another_user(tmp_path / f"rrtrain-{os.geteuid()}", "dir")
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("fork")) as pool:
        found = set(pool.map(_runtime_dir_of_a_process, [str(tmp_path)] * 8))
    assert len(found) == 1 and len([p for p in os.listdir(tmp_path) if p.startswith("rrtrain-")]) == 2


def test_a_redirect_needs_a_private_home(tmp_path, own_home):
    plant_as_another_user(tmp_path / f"rrtrain-{os.geteuid()}", "dir")
    own_home.mkdir()
    own_home.chmod(0o777)
    with pytest.raises(UsageError) as err:
        private_runtime_dir(str(tmp_path))
    text = str(err.value)
    assert "\n" not in text and f"rrtrain-{os.geteuid()}" in text and str(own_home) in text, text


def test_the_directory_can_be_named_explicitly(tmp_path, monkeypatch):
    chosen = tmp_path / "mine"
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(chosen))
    assert private_runtime_dir() == str(chosen) and stat.S_IMODE(chosen.stat().st_mode) == 0o700
    chosen.chmod(0o770)  # the group could plant a lock
    for value in (str(chosen), "relative/dir"):
        monkeypatch.setenv(RUNTIME_DIR_ENV, value)
        with pytest.raises(UsageError) as err:
            private_runtime_dir()
        assert RUNTIME_DIR_ENV in str(err.value) and value in str(err.value) and "\n" not in str(err.value)


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

"""Streaming's shared-memory names on a machine that runs several trainings at once (`rrtrain.data.shm`): dead
runs' names cleaned and live ones kept, exits under the lock, a prefix another program takes first searched
again. Runs started together end to end: tests/e2e/test_concurrent_starts.py (without the guard, 2-3 of 6
processes opening their data at once failed with `FileExistsError: '/0001xx_locals'` on this machine)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess

import pytest

from trainutil import PY, REPO, env


def test_stale_names_beyond_a_gap_are_unlinked(tmp_path):
    """Streaming's cleaner stops at the first free prefix; ours removes leaked names above gaps too, and only
    streaming's names."""
    from rrtrain.data.shm import unlink_stale

    for name in ("000007_locals", "000007_barrier", "000012_shard_states", "000012_cache_usage"):
        (tmp_path / name).write_bytes(b"x")
    for keep in ("rrtrain-streaming.lock", "000003_not_streaming", "psm_1234"):
        (tmp_path / keep).write_bytes(b"x")
    assert unlink_stale(str(tmp_path)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000003_not_streaming", "psm_1234",
                                                          "rrtrain-streaming.lock"]


def test_a_live_runs_segments_are_kept(tmp_path):
    """A segment that a live process maps stays: the next run's clean-up must not pull it from under a run
    still training (its later workers attach by name, and the next dataset would take its prefix)."""
    import mmap

    from rrtrain.data.shm import in_use, unlink_stale

    mapped = []
    for name in ("000041_locals", "000041_barrier", "000042_locals", "000042_barrier"):
        with open(tmp_path / name, "w+b") as f:
            f.write(b"x" * 64)
            f.flush()
            if name != "000042_barrier":  # 42 is dead: only its _locals is mapped, as every reader maps them
                mapped.append(mmap.mmap(f.fileno(), 64))
    try:
        assert {"000041_barrier", "000042_locals"} <= in_use(str(tmp_path))
        assert unlink_stale(str(tmp_path)) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["000041_barrier", "000041_locals"]
    finally:
        for m in mapped:
            m.close()


def test_the_file_locks_of_dead_prefixes_go_with_their_names(tmp_path):
    """Streaming leaves a file lock pair per prefix behind, and its search skips a prefix whose file lock exists:
    a dead prefix's go with its shared memory, a live one's stay, and nothing but streaming's file locks goes."""
    import mmap

    from rrtrain.data.shm import unlink_stale

    shm_dir, lock_dir = tmp_path / "shm", tmp_path / "locks"
    shm_dir.mkdir()
    lock_dir.mkdir()
    mapped = []
    for name in ("000061_locals", "000061_barrier"):
        with open(shm_dir / name, "w+b") as f:
            f.write(b"x" * 64)
            f.flush()
            mapped.append(mmap.mmap(f.fileno(), 64))
    for name in ("000061_barrier_filelock", "000061_cache_filelock", "000062_barrier_filelock",
                 "000063_cache_filelock", "000064_other", "notes"):
        (lock_dir / name).write_bytes(b"")
    try:
        assert unlink_stale(str(shm_dir), lock_dir=str(lock_dir)) == 2
        assert sorted(p.name for p in lock_dir.iterdir()) == ["000061_barrier_filelock", "000061_cache_filelock",
                                                              "000064_other", "notes"]
    finally:
        for m in mapped:
            m.close()


def test_a_dataset_keeps_its_file_locks_in_the_users_own_directory(tmp_path):
    """Not in the temp directory every user writes to, where another user could plant the lock file of the
    prefix a run is about to take (a file of theirs the run cannot open)."""
    from rrtrain.core.host_locks import private_runtime_dir
    from rrtrain.data.shm import file_lock_dir, open_streaming_dataset
    from prep_helpers import write_id_dataset

    data = tmp_path / "data"
    write_id_dataset(data, 8)
    ds = open_streaming_dataset(local=str(data), split="train", batch_size=1)
    assert file_lock_dir() == os.path.join(private_runtime_dir(), "streaming")
    assert os.path.dirname(ds._shared_barrier.filelock_path) == file_lock_dir()
    assert os.path.dirname(ds._cache_filelock_path) == file_lock_dir()
    del ds


def test_a_prefix_without_its_locals_is_dead_however_mapped(tmp_path):
    """A run makes its `_locals` first and unlinks it last: a prefix without one is half of a dead run. Kept
    because some live process still maps it, it made streaming's search for a free prefix end on a live run's
    prefix (`FileExistsError: '/000102_locals'`)."""
    import mmap

    from rrtrain.data.shm import unlink_stale

    mapped = []
    for name in ("000051_barrier", "000051_shard_states", "000052_locals", "000052_barrier"):
        with open(tmp_path / name, "w+b") as f:
            f.write(b"x" * 64)
            f.flush()
            mapped.append(mmap.mmap(f.fileno(), 64))
    try:
        assert unlink_stale(str(tmp_path)) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["000052_barrier", "000052_locals"]
    finally:
        for m in mapped:
            m.close()



MAP_IN_OWN_NAMESPACE = """
import mmap, os, sys
kept = []
for name in sys.argv[2:]:
    with open(os.path.join(sys.argv[1], name), "w+b") as fh:
        fh.write(bytes(64))
        fh.flush()
        kept.append(mmap.mmap(fh.fileno(), 64))
print("mapped", flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a mount namespace needs root")
def test_a_same_named_segment_in_another_mount_namespace_keeps_nothing_alive(tmp_path):
    """A container or a node of the local cluster has a /dev/shm of its own; its processes' maps name their
    segments by the same paths. A dead run's names here must go even while such a process maps its own."""
    from rrtrain.data.shm import unlink_stale

    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    names = ["000077_locals", "000077_barrier"]
    for name in names:
        (shm_dir / name).write_bytes(bytes(64))  # a dead run's, mapped by nobody in this namespace
    script = f'mount -t tmpfs tmpfs {shm_dir} && exec "$0" -c "$1" {shm_dir} {" ".join(names)}'
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, PY,
                             MAP_IN_OWN_NAMESPACE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "mapped", proc.stderr.read()
        assert unlink_stale(str(shm_dir)) == 2
        assert list(shm_dir.iterdir()) == []
    finally:
        proc.kill()
        proc.wait()


HALF_A_RUN = """
import mmap, os, sys
import rrtrain.data.shm as shm
import rrtrain.data.loader as D
from rrtrain.core.lazy_import import streaming_module

prefix = streaming_module("streaming.base.shared.prefix")
constant = streaming_module("streaming.base.constant")
real, planted = shm.unlink_stale, []


def plant(name, data):
    with open(f"/dev/shm/{name}", "w+b") as fh:
        fh.write(data)
        fh.flush()
        planted.append((name, mmap.mmap(fh.fileno(), len(data))))  # mapped by a live process: this one


def planting_unlink_stale(*args, **kwargs):
    # under the machine's lock, which shm_guard holds: no other run probes or registers until the dataset is open
    free = max(prefix._check_and_find([sys.argv[1]], [None], name) for name in constant.SHM_TO_CLEAN)
    plant(f"{free:06d}_{constant.BARRIER}", bytes(64))  # a dead run's half: its _locals went first
    plant(f"{free + 1:06d}_{constant.LOCALS}", prefix._pack_locals(["/nowhere"], free + 1))  # a live run's start
    return real(*args, **kwargs)

shm.unlink_stale = planting_unlink_stale
try:
    D.TrainLoader(sys.argv[1], micro_batch=2, global_batch=2, rank=0, world_size=1, local_rank=0, seed=0,
                  cache_dir=sys.argv[2])
finally:
    for name, mapping in planted:
        mapping.close()
        if name.endswith("_locals"):
            os.unlink(f"/dev/shm/{name}")  # the dead half is gone already, or the next clean-up's
print("opened")
"""


def test_a_dead_runs_half_does_not_send_the_search_onto_a_live_prefix(stories_data, tmp_path):
    """Streaming takes the highest of its searches for a free prefix, one search per kind of name. A dead
    run's `_barrier` without its `_locals` (a resource tracker unlinking a killed process's names in no order)
    sends the `_barrier` search past it, onto a prefix whose `_locals` a live run has just made."""
    tmpdir = tmp_path / "tmp"  # streaming skips prefixes with a lock file in $TMPDIR: none here
    tmpdir.mkdir()
    proc = subprocess.run([PY, "-c", HALF_A_RUN, str(stories_data), str(tmp_path / "cache")], cwd=REPO,
                          env={**env(), "TMPDIR": str(tmpdir)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "opened" in proc.stdout, proc.stderr[-3000:]



LOOKS_PAST = """
import json, os, sys
import rrtrain.data.shm as shm
import rrtrain.data.loader as D
from rrtrain.core.lazy_import import streaming_module

prefix = streaming_module("streaming.base.shared.prefix")
constant = streaming_module("streaming.base.constant")
real, planted = shm.unlink_stale, []
shm._let_go = sys.argv[3] == "control"  # the control keeps streaming's search as it is


def clean_then_plant(*args, **kwargs):
    # under the machine's lock, after the clean-up: another run's names at the first free prefix (every prefix
    # left has its _locals), which this search must look past
    removed = real(*args, **kwargs)
    taken = {n[:6] for n in os.listdir("/dev/shm") if shm.streaming_names().fullmatch(n)}
    free = next(f"{i:06d}" for i in range(1_000_000) if f"{i:06d}" not in taken)
    for kind, data in ((constant.LOCALS, prefix._pack_locals(["/nowhere"], int(free))), (constant.BARRIER, bytes(64))):
        with open(f"/dev/shm/{free}_{kind}", "wb") as fh:
            fh.write(data)
        planted.append(f"/dev/shm/{free}_{kind}")
    return removed


shm.unlink_stale = clean_then_plant
try:
    D.TrainLoader(sys.argv[1], micro_batch=2, global_batch=2, rank=0, world_size=1, local_rank=0, seed=0,
                  cache_dir=sys.argv[2])
    ids = {os.stat(p).st_ino for p in planted}
    mapped = [line.split()[-1] for line in open("/proc/self/maps") if line.split()[4:5] and int(line.split()[4]) in ids]
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.stat(f"/proc/self/fd/{fd}").st_ino in ids:
                held.append(fd)
        except OSError:
            pass  # the listing's own descriptor, closed meanwhile
finally:
    for path in planted:
        if os.path.exists(path):
            os.unlink(path)
print(json.dumps({"planted": planted, "mapped": mapped, "held": held}))
"""


@pytest.mark.parametrize("mode", ["control", "fixed"])
def test_a_search_for_a_free_prefix_keeps_nothing_of_other_runs_open(stories_data, tmp_path, mode):
    """Streaming's search for a free prefix opens the segments of every run below it and keeps them mapped until
    the process exits; a run that died meanwhile would look alive to every clean-up for as long as this process
    lives, and its requeued successor be refused its cache dir. rrtrain's processes let go of them at once. The
    control keeps streaming's search as it is: it shows the test sees what it looks for."""
    tmpdir = tmp_path / "tmp"  # streaming skips prefixes with a lock file in $TMPDIR: none here
    tmpdir.mkdir()
    proc = subprocess.run([PY, "-c", LOOKS_PAST, str(stories_data), str(tmp_path / "cache"), mode], cwd=REPO,
                          env={**env(), "TMPDIR": str(tmpdir)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got["planted"]) == 2
    if mode == "control":
        assert got["mapped"] and got["held"], got
    else:
        assert not got["mapped"] and not got["held"], got


OPEN_THEN_EXIT = """
import sys, rrtrain.data.loader as D
D.eval_batches(sys.argv[1], micro_batch=2, n_batches=1, rank=0, world_size=1, cache_dir=sys.argv[2])
print(*{f"{split.ds._shm_prefix_int:06d}" for split in D._SPLITS.values()}, flush=True)
sys.stdin.readline()
"""


def test_a_run_unlinks_its_names_at_exit_only_under_the_lock(stories_data, tmp_path):
    """A run that ends unlinks its streaming names. Were that to happen while another run's ranks look for a
    free prefix one after the other, they would find different ones ("prefix=N was not registered by local
    leader"). So the exit waits for the lock that the look is made under.

    Other tests on the machine hold the lock too, for longer than an exit waits (`EXIT_LOCK_WAIT_S`): this run
    waits as long as it takes. Its names are told by inode: once they are gone, another run may take the prefix."""
    import fcntl
    import time

    from rrtrain.data.shm import open_machine_lock

    def files(paths: list[str]) -> set[tuple[str, int]]:
        found = set()
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                found.add((path, os.stat(path).st_ino))
        return found

    patient = "import rrtrain.data.shm as S\nS.EXIT_LOCK_WAIT_S = 600\n" + OPEN_THEN_EXIT
    proc = subprocess.Popen([PY, "-c", patient, str(stories_data), str(tmp_path / "cache")], cwd=REPO,
                            env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        prefixes = proc.stdout.readline().split()
        assert prefixes, proc.stderr.read()
        names = [f"/dev/shm/{p}_locals" for p in prefixes]
        with open_machine_lock() as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            own = files(names)  # no other run takes or frees a name while the lock is held
            assert len(own) == len(names)
            proc.stdin.write("\n")
            proc.stdin.flush()
            time.sleep(1.5)
            assert proc.poll() is None and files(names) == own  # waiting to unlink
        assert proc.wait(timeout=600) == 0, proc.stderr.read()
        assert not own & files(names)  # then unlinked
    finally:
        proc.kill()
        proc.wait()


def _names_stay_whole(stories_data, tmp_path, script: str, end) -> None:
    """Run `script` (OPEN_THEN_EXIT or a variant) until it has opened its datasets, then `end` it while this
    test holds the machine's lock (no other run's clean-up takes dead names meanwhile): every streaming name
    it made must still be there. Then clean up as the next run would (a dead name another run looked past
    stays a while)."""
    import fcntl

    from rrtrain.data.shm import open_machine_lock, unlink_stale

    proc = subprocess.Popen([PY, "-c", script, str(stories_data), str(tmp_path / "cache")], cwd=REPO, env=env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        prefixes = proc.stdout.readline().split()
        assert prefixes, proc.stderr.read()
        with open_machine_lock() as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            names = {n for n in os.listdir("/dev/shm") if n[:6] in prefixes}
            assert {f"{p}_locals" for p in prefixes} <= names
            end(proc)
            assert names <= set(os.listdir("/dev/shm"))
            unlink_stale()
    finally:
        proc.kill()
        proc.wait()


def test_a_run_killed_alone_leaves_its_names_whole_for_the_next_clean_up(stories_data, tmp_path):
    """multiprocessing's resource tracker outlives a process killed alone and unlinks the names it made, in no
    order and without the machine's lock, while other runs may be looking for a free prefix. rrtrain keeps
    the tracker away from streaming's names: they stay whole until the next run's clean-up, under the lock."""
    import psutil

    def kill_alone(proc: subprocess.Popen) -> None:
        children = psutil.Process(proc.pid).children(recursive=True)  # a tracker, where one was started
        proc.kill()
        proc.wait()
        psutil.wait_procs(children, timeout=30)

    _names_stay_whole(stories_data, tmp_path, OPEN_THEN_EXIT, kill_alone)


def test_an_exit_without_the_lock_leaves_its_names_to_the_next_clean_up(stories_data, tmp_path):
    """An exit that cannot get the lock (a wedged holder) must still end, and must not unlink while another
    run may be looking for a free prefix: it leaves its names, which the next run's clean-up takes whole."""

    def exit_impatiently(proc: subprocess.Popen) -> None:
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()

    impatient = "import rrtrain.data.shm as S\nS.EXIT_LOCK_WAIT_S = 0.5\n" + OPEN_THEN_EXIT
    _names_stay_whole(stories_data, tmp_path, impatient, exit_impatiently)


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_planted_machine_lock_is_refused_in_one_line(tmp_path, monkeypatch, kind):
    """The machine's lock lives in /dev/shm, which every user writes to: a FIFO there would hang every start,
    a link would make rrtrain create a file where it points."""
    import rrtrain.data.shm as shm
    from rrtrain.core.errors import UsageError

    lock = tmp_path / "rrtrain-streaming.lock"
    os.mkfifo(lock) if kind == "fifo" else lock.symlink_to(tmp_path / "elsewhere")
    monkeypatch.setattr(shm, "SHM_LOCK", str(lock))
    with pytest.raises(UsageError, match="cannot be the machine's streaming lock") as err:
        with shm.shm_guard():
            pytest.fail("the guard was entered")
    assert "\n" not in str(err.value) and not (tmp_path / "elsewhere").exists()


def _taking_first(prefix, constant, taken: list):  # noqa: ANN001 - streaming's modules
    """streaming's SharedMemory, but before this process's first exclusive creation of a `_locals`, another
    "process" creates that very name (what a program that takes no lock of ours does between our search and our
    registration)."""
    from multiprocessing import shared_memory

    real = prefix.SharedMemory

    def shared_memory_(name=None, create=None, size=0, auto_cleanup=True):  # noqa: ANN001, ANN202
        if create is True and name.endswith(f"_{constant.LOCALS}") and not taken:
            data = prefix._pack_locals(["/another/program"], int(name[:6]))
            other = shared_memory.SharedMemory(name, create=True, size=len(data))
            other.buf[:len(data)] = data
            taken.append(other)
        return real(name, create, size, auto_cleanup)

    return shared_memory_


@pytest.mark.parametrize("ours", [True, False], ids=["register_prefix", "streamings_own"])
def test_a_prefix_another_program_takes_first_is_searched_again(tmp_path, monkeypatch, ours):
    """A prefix that another program registers between our search and our registration is a retry, not a crash;
    streaming's own registration (the control) fails there with `FileExistsError: '/0000NN_locals'`."""
    from rrtrain.core.lazy_import import streaming_module
    from rrtrain.data import shm

    prefix = streaming_module("streaming.base.shared.prefix")
    constant = streaming_module("streaming.base.constant")
    world = streaming_module("streaming.base.world").World.detect()
    taken: list = []
    shm.let_go_of_other_runs_names()  # what shm_guard installs, before the test wraps it
    monkeypatch.setattr(prefix, "SharedMemory", _taking_first(prefix, constant, taken))
    register = shm.register_prefix if ours else prefix.get_shm_prefix
    local = [str(tmp_path / "data" / "train")]
    try:
        with shm.shm_guard():  # no other run of ours registers meanwhile
            if not ours:
                with pytest.raises(FileExistsError):
                    register(local, [None], world)
                return
            found, locals_shm = register(local, [None], world)
        assert taken, "nothing was taken first: the test would prove nothing"
        assert found != int(taken[0].name.lstrip("/")[:6])
        assert prefix._unpack_locals(bytes(locals_shm.buf)) == (local, found)
        locals_shm.cleanup()
    finally:
        for other in taken:
            other.close()
            other.unlink()

"""The streaming loader in one process: order, invariance across world sizes, exact resume, refusals, eval set."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from prep_helpers import REPO, read_split, write_id_dataset
from rrtrain.data.loader import TrainLoader, check_vocab, epoch_order, eval_batches, read_manifest
from rrtrain.core.errors import UsageError

N = 204  # samples; with G = 8 an epoch ends mid-step (25.5 steps), with G = 12 exactly at step 17


@pytest.fixture(scope="module")
def ids_data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ids") / "data"
    write_id_dataset(path, N, n_val=40)
    return str(path)


def _loader(path, tmp_path, **kw) -> TrainLoader:
    args = dict(micro_batch=4, global_batch=8, rank=0, world_size=1, local_rank=0, seed=7)
    args.update(kw)
    return TrainLoader(path, cache_dir=str(tmp_path / "cache"), **args)


def _steps(path, tmp_path, steps: int, *, world: int, micro: int, start_state=None, **kw) -> list[list[int]]:
    """Sample ids of each optimizer step, gathered over all ranks and micro-steps (like the trainer)."""
    g = kw.pop("global_batch", 8)
    loaders = [_loader(path, tmp_path, rank=r, world_size=world, micro_batch=micro, global_batch=g, **kw) for r in range(world)]
    if start_state is not None:
        for ld in loaders:
            ld.load_state_dict(start_state)
    its = [iter(ld) for ld in loaders]
    accum = g // (micro * world)
    out = []
    for _ in range(steps):
        ids = []
        for _ in range(accum):
            for it in its:
                batch = next(it)
                assert batch.dtype.is_floating_point is False and tuple(batch.shape) == (micro, loaders[0].seq_len + 1)
                ids += batch[:, 0].tolist()
        out.append(ids)
    for ld in loaders:
        ld.close()
    return out


def test_step_sets_are_the_same_for_any_world_size_micro_batch_and_accumulation(ids_data, tmp_path):
    steps = 60  # crosses two epoch boundaries (one mid-step)
    ref = _steps(ids_data, tmp_path, steps, world=1, micro=8)
    for world, micro in ((1, 4), (2, 4), (2, 2), (4, 1), (1, 1)):
        got = _steps(ids_data, tmp_path, steps, world=world, micro=micro)
        assert [sorted(s) for s in got] == [sorted(s) for s in ref], (world, micro)
    flat = [i for s in ref for i in s]
    for e in range(2):  # every epoch is a permutation: each sample exactly once
        assert sorted(flat[e * N:(e + 1) * N]) == list(range(N))
    assert flat[:N] != flat[N:2 * N]  # reshuffled each epoch


def test_seed_changes_the_order_and_shuffle_false_reads_in_order(ids_data, tmp_path):
    a = _steps(ids_data, tmp_path, 5, world=1, micro=8, seed=1)
    assert a == _steps(ids_data, tmp_path, 5, world=1, micro=8, seed=1)
    assert a != _steps(ids_data, tmp_path, 5, world=1, micro=8, seed=2)
    plain = _steps(ids_data, tmp_path, 30, world=1, micro=8, shuffle=False)
    assert [i for s in plain for i in s] == [i % N for i in range(240)]


@pytest.mark.filterwarnings("ignore:Shuffle block size was smaller")
def test_epoch_order_is_streamings_own_single_rank_order(ids_data, tmp_path):
    """We keep streaming's shuffle (py1e, canonical nodes) and only change how positions map to ranks."""
    from rrtrain.data.shm import open_streaming_dataset

    for ncn, block in ((1, 1 << 18), (2, 60), (4, 50)):
        ds = open_streaming_dataset(local=ids_data, split="train", shuffle=True, shuffle_seed=7,
                                    num_canonical_nodes=ncn, batch_size=1, shuffle_block_size=block)
        for epoch in range(2):
            theirs = [int(s["tokens"][0]) for s in ds]
            ours = epoch_order(np.asarray(ds.samples_per_shard), num_canonical_nodes=ncn, seed=7, epoch=epoch,
                               block_size=block, shuffle=True)
            assert theirs == ours.tolist(), (ncn, epoch)
        del ds


@pytest.mark.parametrize("k, world, micro, workers", [
    (10, 1, 4, 0),   # mid-epoch
    (25, 2, 2, 0),   # the next step straddles the epoch boundary (N / G = 25.5)
    (51, 1, 8, 0),   # exactly at the end of the second epoch (51 * 8 = 2 N)
    (12, 2, 4, 2),   # with DataLoader worker processes
])
def test_resume_continues_exactly(ids_data, tmp_path, k, world, micro, workers):
    total = k + 8
    ref = _steps(ids_data, tmp_path, total, world=world, micro=micro, num_workers=workers)
    loaders = [_loader(ids_data, tmp_path, rank=r, world_size=world, micro_batch=micro, num_workers=workers) for r in range(world)]
    its = [iter(ld) for ld in loaders]
    for _ in range(k * 8 // (micro * world)):
        for it in its:
            next(it)
    state = json.loads(json.dumps(loaders[0].state_dict()))  # what a checkpoint stores
    assert all(ld.state_dict() == state for ld in loaders)
    assert state["step"] == k and state["samples_consumed"] == 8 * k
    assert state["epoch"] == 8 * k // N and state["sample_in_epoch"] == 8 * k % N
    for ld in loaders:
        ld.close()
    resumed = _steps(ids_data, tmp_path, total - k, world=world, micro=micro, num_workers=workers, start_state=state)
    assert resumed == ref[k:]


def test_changed_global_batch_is_refused_unless_allowed_and_world_size_is_free(ids_data, tmp_path):
    ld = _loader(ids_data, tmp_path, world_size=2, rank=1, micro_batch=2)
    it = iter(ld)
    for _ in range(6):
        next(it)
    state = ld.state_dict()
    ld.close()
    # the same global batch at another world size continues exactly, without consent: step 4 of 1 x 8
    ref = _steps(ids_data, tmp_path, 4, world=1, micro=8)
    assert _steps(ids_data, tmp_path, 1, world=1, micro=8, start_state=state) == ref[3:]
    other = _loader(ids_data, tmp_path, world_size=1, micro_batch=4, global_batch=16)
    with pytest.raises(UsageError) as err:
        other.load_state_dict(state)
    assert "global_batch 8 -> 16" in str(err.value) and "world_size" not in str(err.value)
    other.load_state_dict(state, allow_change=True)
    assert other.state_dict()["samples_consumed"] == state["samples_consumed"] == 24
    # the same samples follow, now in global batches of 16
    nxt = next(iter(other))[:, 0].tolist()
    assert nxt == ref[3][:4]  # positions 24..27 of the same global order
    for key, value in (("seed", 8), ("fingerprint", "0" * 64)):
        with pytest.raises(UsageError, match=f"{key} .* can never change"):
            other.load_state_dict({**state, key: value}, allow_change=True)
    other.close()


def test_eval_batches_are_fixed_and_the_same_for_equal_eval_batch(ids_data, tmp_path):
    def union(world, micro):
        per_rank = [eval_batches(ids_data, micro_batch=micro, n_batches=3, rank=r, world_size=world,
                                 cache_dir=str(tmp_path / "ev")) for r in range(world)]
        return [sorted(i for r in range(world) for i in per_rank[r][b][:, 0].tolist()) for b in range(3)]

    ref = union(1, 8)
    assert ref == union(1, 8)
    assert ref == union(2, 4) == union(4, 2)
    assert all(len(b) == 8 for b in ref) and all(i >= 50_000 for b in ref for i in b)  # val rows only
    assert len({i for b in ref for i in b}) == 24
    assert union(1, 16)[0] == sorted(ref[0] + ref[1])


def test_manifest_errors_and_vocab_check(ids_data, tmp_path):
    man = read_manifest(ids_data)
    check_vocab(man, 65536)
    with pytest.raises(UsageError, match="dataset vocabulary 65536 does not fit the model's vocab_size 50257"):
        check_vocab(man, 50257)
    with pytest.raises(UsageError, match="no manifest.json"):
        read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{broken")
    with pytest.raises(UsageError, match="not valid JSON"):
        read_manifest(str(tmp_path))
    with pytest.raises(UsageError, match="not a multiple"):
        _loader(ids_data, tmp_path, global_batch=10)


def test_dataloader_workers_ignore_the_trainers_signals(ids_data, tmp_path):
    import psutil

    before = {c.pid for c in psutil.Process().children()}  # an earlier test's leftovers are not ours to signal
    ld = _loader(ids_data, tmp_path, num_workers=1)
    workers: list = []
    try:
        it = iter(ld)
        first = [next(it) for _ in range(3)]
        workers = [w for w in psutil.Process().children()
                   if w.pid not in before and "resource_tracker" not in " ".join(w.cmdline())]
        assert workers
        for w in workers:
            for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
                os.kill(w.pid, sig)
        time.sleep(0.5)
        assert all(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        more = [next(it) for _ in range(20)]
        assert len(first + more) == 23
    finally:
        # a worker that ignores SIGTERM and outlives a failed test would hang pytest's exit (multiprocessing
        # joins its children there after a SIGTERM): close the loader, and SIGKILL whatever is left
        ld.close()
        _, alive = psutil.wait_procs(workers, timeout=10)
        for w in alive:
            w.kill()
    assert not alive


_CRASH = """
import os, signal, sys
from rrtrain.core.lazy_import import streaming_module  # streaming's own class; `import streaming` adds transformers
StreamingDataset = streaming_module("streaming.base.dataset").StreamingDataset
ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2], split="train", batch_size=1)  # not through rrtrain: the test holds the lock
ds[0]
os.killpg(0, signal.SIGKILL)  # the whole job dies, multiprocessing's resource tracker included
"""
_PROBE = """
import json, sys
import rrtrain.data.loader as D
import rrtrain.data.shm as S
from rrtrain.core.errors import UsageError
def make():
    return D.TrainLoader(sys.argv[1], micro_batch=2, global_batch=2, rank=0, world_size=1, local_rank=0, seed=0,
                         cache_dir=sys.argv[2])
machine_lock, S.SHM_LOCK = S.SHM_LOCK, sys.argv[3]  # the test holds the machine's lock until the control is done
unlink_stale, S.unlink_stale = S.unlink_stale, lambda **_: 0  # control: without the clean-up, streaming refuses
try:
    make()
    control = "opened"
except UsageError as err:
    control = str(err)
print(json.dumps({"control": control}), flush=True)
S.SHM_LOCK, S.unlink_stale = machine_lock, unlink_stale
print(json.dumps({"ids": next(iter(make()))[:, 0].tolist()}))
"""

#: a long-lived process (a trainer opening its validation split, a test worker): one dataset open before a run
#: dies, one after, alive while the dead run's successor starts; every open takes the private lock argv[3]
_LIVES_ON = """
import sys
import rrtrain.data.loader as D
import rrtrain.data.shm as S
S.SHM_LOCK = sys.argv[3]
def make(cache):
    return D.TrainLoader(sys.argv[1], micro_batch=2, global_batch=2, rank=0, world_size=1, local_rank=0, seed=0,
                         cache_dir=cache)
first = make(sys.argv[2] + "/first")
print("opened", flush=True)
sys.stdin.readline()
second = make(sys.argv[2] + "/second")
print("opened", flush=True)
sys.stdin.readline()
"""
_SUCCESSOR = """
import json, sys
import rrtrain.data.loader as D
import rrtrain.data.shm as S
S.SHM_LOCK = sys.argv[3]
loader = D.TrainLoader(sys.argv[1], micro_batch=2, global_batch=2, rank=0, world_size=1, local_rank=0, seed=0,
                       cache_dir=sys.argv[2])
print(json.dumps(next(iter(loader))[:, 0].tolist()))
"""

def _registered_dirs(locals_name: str) -> list[str]:
    """The local dirs a streaming `NNNNNN_locals` segment registers (streaming packs an int32 byte count,
    then the dirs and the prefix joined by NUL); [] when the segment is gone or unreadable."""
    try:
        data = open(os.path.join("/dev/shm", locals_name), "rb").read()
        size = int.from_bytes(data[:4], "little")
        return data[4:size].decode().split("\0")[:-1]
    except (OSError, UnicodeDecodeError):
        return []


def _registers(locals_name: str, cache) -> bool:
    return any(d.startswith(str(cache) + os.sep) for d in _registered_dirs(locals_name))


def _segments_of(cache, names) -> set[str]:
    """Of `names` (in /dev/shm), those of the streaming prefixes whose `_locals` registers a dir under `cache`:
    what our own runs made, whatever else on the machine uses streaming meanwhile."""
    ours = {n[:6] for n in names if n.endswith("_locals") and _registers(n, cache)}
    return {n for n in names if re.match(r"^\d{6}_", n) and n[:6] in ours}


def _still_ours(leaked: set[str], cache) -> set[str]:
    """The `leaked` segments still in /dev/shm, less those whose prefix another run has registered since."""
    left = leaked & set(os.listdir("/dev/shm"))
    taken = {n[:6] for n in left if n.endswith("_locals") and not _registers(n, cache)}
    return {n for n in left if n[:6] not in taken}


def _holders(names: set[str]) -> dict[str, list[str]]:
    """Which processes map or hold open each of `names` (in /dev/shm): what keeps a dead run's names alive,
    for the message of a failed test."""
    inodes = {}
    for name in names:
        with contextlib.suppress(OSError):
            inodes[os.stat(f"/dev/shm/{name}").st_ino] = name
    found: dict[str, list[str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")[:160].decode(errors="replace")
            hits = {inodes[int(f[4])] for f in (line.split(None, 5) for line in open(f"/proc/{pid}/maps"))
                    if len(f) == 6 and f[5].startswith("/dev/shm/") and int(f[4]) in inodes}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                        hits.add(inodes.get(os.stat(f"/proc/{pid}/fd/{fd}").st_ino, ""))
            for name in hits - {""}:
                found.setdefault(name, []).append(f"{pid} {cmd}")
    return found


@pytest.mark.slow
def test_stale_shared_memory_of_a_killed_run_does_not_break_the_next(tmp_path):
    """A job SIGKILLed while reading leaks /dev/shm segments registered to its cache dir. Its requeued
    successor (same cache dir, fresh TMPDIR as on Slurm) must start, and the leaked segments must go.

    Only the segments registered to this test's cache dir count. The test holds the machine's streaming
    lock (`open_machine_lock`) from the crash to the control, so no other rrtrain process on the machine cleans the
    leak (or registers a prefix) in between; the control takes a private lock."""
    from rrtrain.data.shm import open_machine_lock

    data = tmp_path / "zdata"
    write_id_dataset(data, 64, compression="zstd")  # compressed: read through a local cache, like a remote
    cache = tmp_path / "cache"
    tmp_a, tmp_b = tmp_path / "tmp_a", tmp_path / "tmp_b"
    tmp_a.mkdir()
    tmp_b.mkdir()
    with open_machine_lock() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        crash = subprocess.run([sys.executable, "-c", _CRASH, str(data), str(cache / "loader")], cwd=REPO,
                               capture_output=True, text=True, timeout=300, start_new_session=True,
                               env={**os.environ, "TMPDIR": str(tmp_a)})
        assert crash.returncode == -signal.SIGKILL, crash.stderr
        leaked = _segments_of(cache, os.listdir("/dev/shm"))
        assert any(n.endswith("_locals") for n in leaked), "nothing leaked; the test would prove nothing"
        with open(tmp_path / "probe.err", "w") as err_file:
            probe = subprocess.Popen([sys.executable, "-c", _PROBE, str(data), str(cache), str(tmp_path / "own.lock")],
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=err_file, text=True,
                                     env={**os.environ, "TMPDIR": str(tmp_b)})
        watchdog = threading.Timer(300, probe.kill)  # a hung control must not hold the machine's lock for good
        watchdog.start()
        try:
            first = probe.stdout.readline()  # the control's line; then release the lock for the real start
        finally:
            watchdog.cancel()
            fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        out = probe.communicate(timeout=300)[0]
    finally:
        probe.kill()
    assert probe.returncode == 0, (tmp_path / "probe.err").read_text()[-2000:] + f"\nheld by: {_holders(leaked)}"
    got = {**json.loads(first), **json.loads(out.strip().splitlines()[-1])}
    assert "Reused local directory" in got["control"]
    assert len(got["ids"]) == 2
    assert not _still_ours(leaked, cache)


@pytest.mark.slow
def test_a_dataset_opened_after_a_run_died_does_not_keep_its_memory_alive(tmp_path):
    """Streaming's search for a free prefix maps every segment it looks past until the process exits. A process
    that opens a second dataset after a run died (a trainer's validation split, a sweep's long-lived worker)
    cleans the dead run's segments first: had it searched past them, they would look alive to every later
    clean-up, and the dead run's successor would be refused its cache dir for as long as that process lives.
    The test holds the machine's streaming lock throughout; its processes take a private one."""
    from rrtrain.data.shm import open_machine_lock

    data = tmp_path / "zdata"
    write_id_dataset(data, 64, compression="zstd")
    cache, own_lock = tmp_path / "cache", str(tmp_path / "own.lock")
    tmp = {name: tmp_path / f"tmp_{name}" for name in ("other", "crash", "successor")}  # one per job, as on Slurm
    for path in tmp.values():
        path.mkdir()
    with open_machine_lock() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        other = subprocess.Popen([sys.executable, "-c", _LIVES_ON, str(data), str(tmp_path / "other"), own_lock],
                                 cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "TMPDIR": str(tmp["other"])})
        watchdog = threading.Timer(300, other.kill)  # a hung process must not hold the machine's lock for good
        watchdog.start()
        try:
            assert other.stdout.readline() == "opened\n"
            crash = subprocess.run([sys.executable, "-c", _CRASH, str(data), str(cache / "loader")], cwd=REPO,
                                   capture_output=True, text=True, timeout=300, start_new_session=True,
                                   env={**os.environ, "TMPDIR": str(tmp["crash"])})
            assert crash.returncode == -signal.SIGKILL, crash.stderr
            leaked = _segments_of(cache, os.listdir("/dev/shm"))
            assert any(n.endswith("_locals") for n in leaked), "nothing leaked; the test would prove nothing"
            other.stdin.write("\n")
            other.stdin.flush()
            assert other.stdout.readline() == "opened\n"
            successor = subprocess.run([sys.executable, "-c", _SUCCESSOR, str(data), str(cache), own_lock], cwd=REPO,
                                       capture_output=True, text=True, timeout=300,
                                       env={**os.environ, "TMPDIR": str(tmp["successor"])})
        finally:
            watchdog.cancel()
            other.kill()
            other.wait()
    assert successor.returncode == 0, successor.stderr[-2000:]
    assert len(json.loads(successor.stdout.strip().splitlines()[-1])) == 2
    assert not _still_ours(leaked, cache)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_rows_read_from_the_shards_equal_streamings_own_decode(tmp_path, compression):
    """The row path (each shard opened once by rrtrain, rows read from its descriptor; a compressed one
    decompressed into the cache first) returns what streaming decodes from the dataset itself."""
    from rrtrain.data.loader import _open_split

    path = tmp_path / "d"
    man = write_id_dataset(path, 150, seq_len=5, shard_size=512, compression=compression)
    opened = _open_split(str(path), man, "train", str(tmp_path / "c"), batch_size=1, num_canonical_nodes=1, seed=0)
    assert len(opened.ds.shards) >= 5
    ids = np.random.default_rng(0).permutation(150)
    fast = opened.rows(ids).numpy()
    assert len(opened.rows._shards) == len(opened.ds.shards)
    assert all(m is not None for m in opened.rows._shards.values())  # no shard fell back to a per-sample decode
    slow = read_split(path, "train")[ids].astype(np.int64)
    assert (fast == slow).all() and (fast[:, 0] == ids).all()

"""What a multi-node run records about where it ran (issue 25), without a cluster: each rank's host file
(rrtrain/rundir/ranks.py), the watchdog naming a lost rank's host, and a GLOO_SOCKET_IFNAME the host lacks
refused in one line naming the setting. The cluster tests (tests/slurm/test_multinode_2node.py,
test_node_faults.py, test_rendezvous_errors.py) run the same across two nodes."""

from __future__ import annotations

import json
import socket

import pytest

from rrtrain.core import dist
from rrtrain.core.errors import UsageError
from rrtrain.monitoring.watchdog import PeerWatch
from rrtrain.rundir import ranks


def test_each_rank_of_a_distributed_run_records_its_host(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    ranks.record(tmp_path, rank=3, local_rank=1, world_size=4)
    rec = json.loads((tmp_path / "ranks" / "rank3.json").read_text())
    assert {k: rec[k] for k in ("rank", "local_rank", "world_size", "node_rank", "host", "job_id", "restart")} == {
        "rank": 3, "local_rank": 1, "world_size": 4, "node_rank": 1, "host": socket.gethostname(), "job_id": "42",
        "restart": 2}
    assert ranks.hosts(tmp_path) == {3: socket.gethostname()} and ranks.hosts(tmp_path, world_size=2) == {}


def test_one_process_records_nothing_and_an_unwritable_directory_is_a_warning(tmp_path, capsys):
    ranks.record(tmp_path, rank=0, local_rank=0, world_size=1)
    assert not (tmp_path / "ranks").exists()
    blocker = tmp_path / "ranks"
    blocker.write_text("a file where the directory belongs")
    ranks.record(tmp_path, rank=1, local_rank=1, world_size=2)
    assert "cannot record rank 1's host" in capsys.readouterr().err


def test_the_watchdog_names_a_lost_rank_with_its_host():
    watch = object.__new__(PeerWatch)
    watch.info = dist.DistInfo(rank=0, world_size=2, local_rank=0, device=None)
    watch.hosts, watch.store_lost_at = {1: "rrnode2"}, None
    message = watch.message([1], 16)
    assert message.startswith("rank 1 of 2 stopped responding (no heartbeat for 16 s")
    assert "rank 1 ran on rrnode2" in message


def test_after_a_failed_collective_the_watch_stops_waiting_when_the_process_is_being_stopped(monkeypatch):
    """Slurm ends the job of a node it declared down with SIGTERM and SIGKILL KillWait seconds later: the wait
    for a dead rank's heartbeat to go stale gives up at the signal, so final.json is written before the kill."""
    import threading
    import time

    from rrtrain.monitoring import watchdog

    watch = object.__new__(PeerWatch)
    watch.info = dist.DistInfo(rank=0, world_size=2, local_rank=0, device=None)
    watch.interval, watch.hosts, watch.store_lost_at = 5.0, {1: "rrnode2"}, None
    watch._lock = threading.Lock()
    watch.seen = {1: ("7", time.monotonic())}  # rank 1 beat just now: not yet silent for the grace
    naps: list[float] = []
    monkeypatch.setattr(watchdog.time, "sleep", naps.append)
    asked = iter([False, False, True])  # the signal arrives after two rounds
    assert watch.lost(give_up=lambda: next(asked)) is None
    assert naps == [2.5, 2.5]
    watch.seen = {1: ("7", time.monotonic() - 60)}  # silent for long: named at once, signal or not
    assert watch.lost(give_up=lambda: False).startswith("rank 1 of 2 stopped responding")


def test_a_stuck_rank_being_stopped_ends_once_its_peer_is_silent_for_the_grace_not_the_timeout():
    """The main thread blocked in a collective that does not fail, the job being ended by Slurm (SIGTERM, then
    SIGKILL KillWait seconds later): the watch's thread ends the run, final.json first, once the peer has been
    silent for the grace, not for parallel.timeout_s, which would outlast the kill."""
    import threading
    import time

    watch = object.__new__(PeerWatch)
    watch.info = dist.DistInfo(rank=0, world_size=2, local_rank=0, device=None)
    watch.timeout_s, watch.interval, watch.hosts, watch.store_lost_at = 600.0, 0.01, {1: "rrnode2"}, None
    watch._lock, watch._stop, watch._ended = threading.Lock(), threading.Event(), False
    watch.seen = {1: ("7", time.monotonic() - 60)}  # rank 1 went silent a minute ago: far less than the timeout
    watch.poll = lambda: None
    rounds = iter(range(1_000_000))
    signalled_at = 5
    watch.stopping = lambda: next(rounds) >= signalled_at  # the SIGTERM arrives in the sixth round
    ended: list[str] = []
    watch._end = lambda message: (ended.append(message), watch._stop.set())
    thread = threading.Thread(target=watch._run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and len(ended) == 1
    assert next(rounds) == signalled_at + 1, "ended in the round the signal arrived, not before"
    assert ended[0].startswith("rank 1 of 2 stopped responding (no heartbeat for 1 s") and "rrnode2" in ended[0]


class _Store:
    """The c10d store's calls the watch makes, on a dict."""

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.values[k] for k in keys]


def test_a_job_suspended_whole_does_not_take_its_peers_for_dead(monkeypatch):
    """SIGSTOP to every rank (a suspended job: `scontrol suspend`, gang scheduling; a test holding its ranks until
    Slurm's warning comes) stops every beat. The first rank to run again polls before its peers have beaten:
    the time this process did not run counts as no peer's silence, while a peer silent over rounds this
    process ran is still named."""
    import threading

    from rrtrain.monitoring import watchdog

    clock = [1000.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock[0])
    watch = object.__new__(PeerWatch)
    watch.info = dist.DistInfo(rank=0, world_size=2, local_rank=0, device=None)
    watch.interval, watch.timeout_s, watch.hosts, watch.store_lost_at, watch.polled_at = 5.0, 600.0, {}, None, None
    watch.peers, watch.beats, watch._lock = [1], 0, threading.Lock()
    watch.store = _Store({"rrtrain/heartbeat/1": b"7", "rrtrain/host/1": b"rrnode2"})
    watch.store_answers = lambda: True
    watch.seen = {1: ("", clock[0])}
    watch.poll()  # rank 1's beat "7", seen now
    clock[0] += 5
    watch.poll()
    clock[0] += 40  # this process stopped for 40 s with its peer; it runs again first
    watch.poll()
    assert watch.silent(watch.grace) == [] and watch.silent(watch.timeout_s) == []
    for _ in range(4):  # rounds this process ran, rank 1 silent through them: 20 s, past the grace of 16
        clock[0] += 5
        watch.poll()
    assert watch.silent(watch.grace) == [1]


def test_a_gloo_interface_the_host_lacks_is_one_line_naming_the_setting(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "bogus0")
    err = RuntimeError("[enforce fail at device.cc:84] ifa != nullptr. Unable to find address for: bogus0")
    with pytest.raises(UsageError, match=r"^GLOO_SOCKET_IFNAME=bogus0: no such network interface on .* \(it has"):
        dist._explain_interface(err)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    dist._explain_interface(err)  # not set: nothing to explain, the caller re-raises gloo's error


def test_status_names_the_nodes_of_the_latest_start_and_ignores_hostile_rank_files(tmp_path):
    """`rrtrain status` shows where a distributed run's ranks ran (its last start's layout): a 2-node run
    resumed on one node shows one host; rank files that are garbage or of the wrong shape are left out."""
    from launchers.state import status as status_cli
    from launchers.state.runstate import run_row
    from launchers.sweep.record import RunEntry

    (tmp_path / "ranks").mkdir()
    for rank, host, world, started in ((0, "n1", 4, 1.0), (1, "n1", 4, 1.0), (2, "n2", 4, 1.0), (3, "n2", 4, 1.0)):
        (tmp_path / "ranks" / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "host": host, "world_size": world, "started": started}))
    assert ranks.nodes(tmp_path) == ["n1", "n2"]
    for rank in (0, 1):  # the resume on one node rewrites the ranks it has
        (tmp_path / "ranks" / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "host": "n3", "world_size": 2, "started": 9.0}))
    (tmp_path / "ranks" / "rank7.json").write_text("[1, 2]")
    (tmp_path / "ranks" / "rank8.json").write_text('{"rank": "8", "host": "evil"}')
    (tmp_path / "ranks" / "rank9.json").write_bytes(b"\xff\xfe")
    assert ranks.nodes(tmp_path) == ["n3"]
    entry = {"dir": str(tmp_path), "variant": "review", "size": "tiny", "seed": 0,
             "config": {"train": {"max_steps": 10}, "model": {}}}
    row = run_row("tiny-review-s0", RunEntry(**entry), None, submitted=True)
    assert row["nodes"] == ["n3"]
    text = status_cli.table({"sweep": "s", "dir": str(tmp_path), "runs": [row], "counts": {}})
    assert "nodes" in text.splitlines()[1] and " n3 " in text.splitlines()[2]

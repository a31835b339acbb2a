"""The multi-node rendezvous, as a co-tenant would attack it (launchers.torchrun): its port and id come from a
file of the user's that no one else can read, never from the job id or the command line; the agent that hosts
the store binds the port itself and ends in one line when another process holds it (torch would connect to that
process as a client); and a rendezvous state someone else wrote into the store runs no code when read back."""

from __future__ import annotations

import base64
import os
import pickle
import select
import socket
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousStateError
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from launchers.torchrun import node, rendezvous, rendezvous_state
from rrtrain.core.errors import UsageError
from trainutil import free_port

TORCHRUN = ["--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d", "--max_restarts=0"]


def drawn(tmp_path: Path, port: int | None = None) -> Path:
    path = tmp_path / "job.rendezvous"
    rendezvous.write(path, rendezvous.draw(port))
    return path


def test_a_drawn_rendezvous_is_random_and_readable_by_its_owner_only(tmp_path):
    a, b = rendezvous.draw(), rendezvous.draw()
    assert a.id != b.id and len(a.id) == len("rrtrain-") + 32
    assert all(rendezvous.PORTS[0] <= r.port <= rendezvous.PORTS[1] for r in (a, b))
    ports = {rendezvous.draw().port for _ in range(50)}
    assert len(ports) > 40  # not one port per job id: drawn
    path = drawn(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert rendezvous.read(path) == rendezvous.read(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # nothing left beside it
    assert rendezvous.main(["new", str(tmp_path / "cli"), "--port", "23456"]) == 0
    assert rendezvous.read(tmp_path / "cli").port == 23456


def test_a_rendezvous_file_anyone_else_could_have_written_or_read_is_refused(tmp_path):
    good = drawn(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(good)
    (tmp_path / "r").mkdir()
    readable = drawn(tmp_path / "r")
    readable.chmod(0o644)
    theirs = tmp_path / "theirs"
    theirs.write_bytes(good.read_bytes())
    theirs.chmod(0o600)
    os.chown(theirs, 65534, 65534)  # another user's (the suite runs as root, as CI does)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    garbage = tmp_path / "garbage"
    garbage.write_text('{"port": 80, "id": "rrtrain-0123456789abcdef"}')
    garbage.chmod(0o600)
    short_id = tmp_path / "short"
    short_id.write_text('{"port": 23000, "id": "x"}')
    short_id.chmod(0o600)
    expect = {link: "symbolic link", readable: "mode 600", fifo: "not a regular file", garbage: "port 80",
              short_id: "not a rendezvous", tmp_path / "missing": "No such file"}
    if os.getuid() == 0:
        expect[theirs] = "must belong to you"
    for path, why in expect.items():
        with pytest.raises(UsageError, match=why) as err:
            rendezvous.read(path)
        assert "\n" not in str(err.value)


def forged_state(marker: Path) -> bytes:
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    return pickle.dumps(Payload())


def real_state() -> dyn._RendezvousState:
    state = dyn._RendezvousState()
    a, b = dyn._NodeDesc("node1", 11, 0), dyn._NodeDesc("node2", 12, 1)
    state.round, state.complete, state.closed = 3, True, False
    state.deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
    state.participants, state.wait_list, state.redundancy_list = {a: 0}, {b}, {b}
    state.last_heartbeats = {a: datetime.now(timezone.utc), b: datetime.now()}
    return state


def test_the_state_unpickler_builds_the_rendezvous_types_and_nothing_else(tmp_path):
    state = real_state()
    back = rendezvous_state.loads(pickle.dumps(state))
    assert back.__dict__ == state.__dict__
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        rendezvous_state.loads(forged_state(marker))
    assert not marker.exists()


def test_a_forged_state_in_a_real_store_runs_nothing_in_the_agent(tmp_path, monkeypatch):
    """What a co-tenant who reaches the store does: list its keys (the id is among them), write a pickle."""
    monkeypatch.setattr(dyn, "pickle", dyn.pickle)  # install() below is undone after the test
    rendezvous_state.install()
    marker = tmp_path / "ran"
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    agent = C10dRendezvousBackend(server, "rrtrain-secret")
    settings = dyn.RendezvousSettings("rrtrain-secret", 1, 1, dyn.RendezvousTimeout(), timedelta(seconds=5), 3)
    holder = dyn._BackendRendezvousStateHolder(agent, settings, cache_duration=0)
    holder.state.round = 1
    holder.mark_dirty()
    holder.sync()  # the agent writes the state as torch does
    intruder = dist.TCPStore("127.0.0.1", port, is_master=False)
    key = next(k for k in intruder.list_keys() if k.startswith("torch.rendezvous."))
    intruder.set(key, base64.b64encode(forged_state(marker)))
    with pytest.raises(RendezvousStateError, match="corrupt"):
        holder.sync()
    assert not marker.exists()


def squat(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", port))
    sock.listen(8)
    return sock


def test_a_held_rendezvous_port_ends_the_agent_in_one_line_and_it_never_connects(tmp_path, monkeypatch, capsys):
    port = free_port()
    monkeypatch.setenv(node.RDZV_FILE_ENV, str(drawn(tmp_path, port)))
    squatter = squat(port)
    try:
        code = node.main([*TORCHRUN, "--rdzv_endpoint=127.0.0.1", "-m", "rrtrain.train", "x.yaml"])
        pending = select.select([squatter], [], [], 0.5)[0]
    finally:
        squatter.close()
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert f"the rendezvous port {port} on 127.0.0.1" in err and "another process holds it" in err
    assert not pending, "the agent connected to the process that holds its port"


@pytest.mark.parametrize("argv, why", [
    (["--rdzv_endpoint=127.0.0.1:29400"], "give the host only"),
    (["--rdzv_endpoint=127.0.0.1", "--rdzv_id=rrtrain-123"], "comes from the rendezvous file"),
])
def test_the_port_and_id_never_come_from_the_command_line(tmp_path, monkeypatch, capsys, argv, why):
    monkeypatch.setenv(node.RDZV_FILE_ENV, str(drawn(tmp_path)))
    assert node.main([*TORCHRUN, *argv, "-m", "rrtrain.train", "x.yaml"]) == 2
    assert why in capsys.readouterr().err


def test_without_a_rendezvous_file_the_agent_does_not_start(monkeypatch, capsys):
    monkeypatch.delenv(node.RDZV_FILE_ENV, raising=False)
    assert node.main([*TORCHRUN, "--rdzv_endpoint=127.0.0.1", "-m", "rrtrain.train", "x.yaml"]) == 2
    assert "RRTRAIN_RDZV_FILE is not set" in capsys.readouterr().err


def test_only_the_head_node_hosts_the_store(tmp_path):
    from torch.distributed import run

    rdzv = rendezvous.draw()
    for is_host in (True, False):
        args = run.get_args_parser().parse_args(
            [*TORCHRUN, "--rdzv_endpoint=rrnode1", "--rdzv_conf=join_timeout=30,is_host=true", "x.py"])
        node.rendezvous_args(args, rdzv, is_host)
        assert args.rdzv_endpoint == f"rrnode1:{rdzv.port}" and args.rdzv_id == rdzv.id
        assert args.rdzv_conf == f"join_timeout=30,is_host={str(is_host).lower()}"


def test_a_held_master_port_is_one_line_not_a_client_of_its_holder():
    from rrtrain.core.stores import serve_env_store

    port = free_port()
    squatter = squat(port)
    try:
        with pytest.raises(UsageError, match=f"MASTER_PORT {port} on 127.0.0.1 .*another process holds it"):
            serve_env_store("127.0.0.1", port, 5)
        assert not select.select([squatter], [], [], 0.2)[0]
    finally:
        squatter.close()

"""Listening sockets: a single-node launch (the command `launchers.executors.render.train_argv` gives the local
executor and the array scripts) hosts torchrun's stores on loopback only. A real 2-rank run of the tiny
preset is watched (psutil, every process of the job) while it trains: no socket of it listens on 0.0.0.0 or
`::`, and the stores do listen, on 127.0.0.1. (Multi-node rendezvous ports are per job: 20000 + job id mod
10000, tested on the local cluster in tests/slurm/test_rendezvous_ports.py.)
Budget: one 2-rank run of 3 steps, about 30 s."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from launchers.sweep.expand import Run
from launchers.executors.render import train_argv
from launchers.sweep.spec import Resources
from rrtrain.core.child_python import MODULE_AT, module_argv
from trainutil import REPO, TINY, env, free_port

WILDCARD = {"0.0.0.0", "::", "::ffff:0.0.0.0", ""}


def _listening(root: psutil.Process) -> set[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of `root` and its descendants."""
    found = set()
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for p in procs:
        try:
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    found.add((p.pid, c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.mark.slow
def test_a_single_node_launch_listens_on_loopback_only(stories_data, tmp_path):
    cfg = yaml.safe_load(Path(TINY).read_text())
    cfg["data"] = {"path": str(stories_data), "eval_batches": 1}
    cfg["run"] = {"dir": str(tmp_path / "run")}
    cfg["train"].update(max_steps=3, global_batch=4, micro_batch=2, eval_every=0, log_every=1)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run = Run("tiny-review-s0", "tiny", "review", 0, cfg, Resources(tasks_per_node=2))
    argv = train_argv(run, sys.executable, config)
    assert "--standalone" not in argv and argv[:MODULE_AT + 1] == module_argv("launchers.torchrun.local")
    proc = subprocess.Popen(argv, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(proc.pid)
    seen: set[tuple[int, str, int]] = set()
    while proc.poll() is None:
        seen |= _listening(root)
        time.sleep(0.1)
    out = proc.stdout.read()
    assert proc.returncode == 0, out[-3000:]
    assert "completed at step 3/3" in out, out[-3000:]
    exposed = sorted(s for s in seen if s[1] in WILDCARD)
    assert not exposed, f"sockets of the job listen on every interface: {exposed}"
    assert sum(1 for s in seen if s[0] == proc.pid and s[1] == "127.0.0.1") >= 2, seen  # both stores, on loopback


def test_rank0_of_an_env_launch_serves_its_store_on_master_addr_only():
    """Under an env:// launcher without torchrun's agent (submitit's srun tasks), rank 0 hosts the store the
    ranks meet at: on MASTER_ADDR's address, at MASTER_PORT, and nothing of the process on every interface
    (rrtrain.core.dist; across nodes on the local cluster in tests/slurm/test_multinode_2node.py)."""
    port = free_port()
    script = ("import json, psutil\nfrom rrtrain.core import dist\ndist.setup(60)\n"
              "print(json.dumps(sorted({(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections('tcp')"
              " if c.status == psutil.CONN_LISTEN})))\ndist.teardown()\n")
    e = {**env(), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": str(port)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=e, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listening = {(ip, p) for ip, p in json.loads(proc.stdout.splitlines()[-1])}
    assert ("127.0.0.1", port) in listening, listening
    assert not {s for s in listening if s[0] in WILDCARD}, f"listening on every interface: {listening}"

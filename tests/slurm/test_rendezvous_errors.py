"""A multi-node job that cannot form its group ends within a bounded time with a line naming the setting to
change, never a hang: a GLOO_SOCKET_IFNAME the nodes lack (the agents meet, then every rank says so in one line
and exits 2), an unreachable rendezvous host (the agents give up after RDZV_TIMEOUT_S) and a python that does not
exist (no agent starts). The script's last error line tells the three apart. And a co-tenant who holds the
rendezvous port: one line naming it, and nothing it writes runs. All on 2 nodes, one rank each."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from launchers.torchrun import rendezvous
from slurmutil import NODES, ON_NODE, REPO, cancel, sbatch, wait_done
from trainutil import PY, TINY, env

pytestmark = pytest.mark.distributed

ARGS = ["train.max_steps=2", "train.eval_every=0", "train.ckpt_every=0", "train.global_batch=8",
        "train.micro_batch=4", "parallel.backend=fsdp"]
TIMEOUT_S = 15  # RDZV_TIMEOUT_S of the unreachable-head job
BOUND_S = 150  # submission to the end of either job, start-up on 2 shared cores included


def test_wrong_interface_unreachable_head_and_missing_python_each_end_in_their_own_line(slurm_cluster, tmp_path, stories_data):
    cases = {"ifname": {"GLOO_SOCKET_IFNAME": "bogus0"},
             "head": {"RDZV_HOST": "198.18.0.99", "RDZV_TIMEOUT_S": str(TIMEOUT_S)},
             "python": {"RRTRAIN_PYTHON": str(tmp_path / "no-such-python")}}
    agents = Path.home() / ".rrtrain" / "torchrun"  # the script's AGENT_DIR: shared by the nodes
    before = set(p.name for p in agents.iterdir()) if agents.is_dir() else set()  # other clusters' job ids repeat
    jobs, t0 = {}, time.time()
    for name, extra in cases.items():
        run = tmp_path / name
        e = {**env(), "RRTRAIN_PYTHON": PY, "RRTRAIN_NPROC_PER_NODE": "1", "RRTRAIN_RUN_DIR": str(run), **extra}
        jobs[name] = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1",
                            "--cpus-per-task=1", "--mem=1G", "--time=10", f"--output={tmp_path / name}.log",
                            args=(TINY, f"data.path={stories_data}", f"run.dir={run}", *ARGS), env=e)
    try:
        states = {name: wait_done(job, timeout=BOUND_S)[job] for name, job in jobs.items()}
    finally:
        cancel(*jobs.values())
    took = time.time() - t0
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in jobs}
    assert states == dict.fromkeys(cases, "FAILED"), "\n".join(t[-3000:] for t in logs.values())
    assert took < BOUND_S
    lines = [line for line in logs["ifname"].splitlines() if line.startswith("rrtrain train: error:")]
    assert len(lines) == NODES and all("GLOO_SOCKET_IFNAME=bogus0: no such network interface on rrnode" in line
                                       for line in lines), logs["ifname"][-3000:]
    why = {name: [line for line in text.splitlines() if line.startswith("rrtrain multinode: error:")]
           for name, text in logs.items()}
    assert all(len(lines) == 1 and "no rank started" in lines[0] for lines in why.values()), why
    assert "the agents met at rrnode1:" in why["ifname"][0] and "every rank failed at start" in why["ifname"][0]
    assert "GLOO_SOCKET_IFNAME" in why["ifname"][0] and "did not meet" not in why["ifname"][0], why
    assert "did not meet at 198.18.0.99:" in why["head"][0] and "RDZV_HOST" in why["head"][0], why
    assert "the torchrun agent did not start on rrnode1" in why["python"][0], why
    assert "no-such-python" in why["python"][0] and "did not meet" not in why["python"][0], why
    left = [p.name for p in agents.iterdir() if p.name not in before] if agents.is_dir() else []
    assert not [n for n in left for job in jobs.values() if n.startswith(f"{job}-")], "the agents' logs stay"


SQUATTER = """
import base64, os, pickle, sys, time
import torch.distributed as dist

port, marker, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3]
store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False)


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))


forged = base64.b64encode(pickle.dumps(Payload()))
open(ready, "w").close()
while True:  # whatever rendezvous state an agent writes here, replace it with one that runs code when unpickled
    for key in store.list_keys():
        if key.startswith("torch.rendezvous.") and store.get(key) != forged:
            store.set(key, forged)
    time.sleep(0.02)
"""


def test_a_co_tenant_holding_the_rendezvous_port_gets_one_line_and_runs_no_code(slurm_cluster, tmp_path, stories_data):
    """A co-tenant's store on the job's rendezvous port of the head node, rewriting every rendezvous state the
    agents write into one that runs code when unpickled. The head's agent cannot bind the port and ends the job
    in one line naming it (torch would have become a client of that store); the other node's agent, which
    cannot tell, meets the forged state and refuses it; nothing of it runs."""
    rdzv = rendezvous.draw()
    path, marker, ready = tmp_path / "job.rendezvous", tmp_path / "ran", tmp_path / "ready"
    rendezvous.write(path, rdzv)
    squatter = subprocess.Popen(["bash", str(ON_NODE), "1", PY, "-c", SQUATTER, str(rdzv.port), str(marker),
                                 str(ready)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not ready.exists():
            assert squatter.poll() is None and time.time() < deadline, squatter.stderr.read() if squatter.poll() else ""
            time.sleep(0.2)
        run, log = tmp_path / "run", tmp_path / "job.log"
        e = {**env(), "RRTRAIN_PYTHON": PY, "RRTRAIN_NPROC_PER_NODE": "1", "RRTRAIN_RUN_DIR": str(run),
             "RRTRAIN_RDZV_FILE": str(path), "RDZV_TIMEOUT_S": str(TIMEOUT_S)}
        job = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1",
                     "--cpus-per-task=1", "--mem=1G", "--time=10", f"--output={log}",
                     args=(TINY, f"data.path={stories_data}", f"run.dir={run}", *ARGS), env=e)
        try:
            state = wait_done(job, timeout=BOUND_S)[job]
        finally:
            cancel(job)
        alive = squatter.poll() is None
    finally:
        squatter.kill()
        squatter.wait(timeout=30)
    text = log.read_text()
    assert alive, "the squatter died before the job ended"
    assert state == "FAILED", text[-3000:]
    held = [line for line in text.splitlines() if "another process holds it" in line]
    assert len(held) == 1 and held[0].startswith("rrtrain multinode: error: the rendezvous port "), text[-3000:]
    assert f"port {rdzv.port} on rrnode1" in held[0], held
    assert not marker.exists(), "a rendezvous state written by another process ran code in the job"

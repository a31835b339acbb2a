"""The local cluster itself (slurm/local/start.sh --nodes 2): each node is a host of its own, with its own
hostname, address on 198.18.0.0/24 (and no route off it), /tmp and /dev/shm, while the shared file system is
shared; names resolve on every node; one partition spans both; stop.sh leaves no daemon, namespace, link or
mount behind, and start.sh brings the same cluster back."""

from __future__ import annotations

import fcntl
import json
import subprocess
import time
from pathlib import Path

import pytest

from slurmutil import NODES, ON_NODE, SESSION_LOCK, START, STOP, cancel, sbatch, wait_done

NAMES = [f"rrnode{i}" for i in range(1, NODES + 1)]
ADDRS = {f"rrnode{i}": f"198.18.0.{10 + i}" for i in range(1, NODES + 1)}

# One task per node: what the node looks like from inside, as JSON; a file in its /tmp and one on the shared file
# system, then (after every node wrote) what each node sees of the others' files.
PROBE = r"""#!/bin/bash
srun --nodes=$SLURM_NNODES --ntasks-per-node=1 bash -c '
me=$(hostname); out="$1"
tag=rr-probe-$SLURM_JOB_ID
echo "$me" > /tmp/$tag-$me; echo "$me" > "$out/shared-$me"; touch /dev/shm/$tag-$me
sleep 2
resolved=$(for n in '"${NAMES}"'; do getent hosts $n | cut -d" " -f1; done | paste -sd,)
printf "{\"host\": \"%s\", \"addr\": \"%s\", \"resolved\": \"%s\", \"routes\": \"%s\", \"tmp\": \"%s\", \"shm\": \"%s\", \"shared\": \"%s\"}\n" \
  "$me" "$(ip -4 -o addr show dev eth0 | awk "{print \$4}")" "$resolved" "$(ip route | paste -sd";")" \
  "$(ls /tmp | grep "^$tag-" | paste -sd,)" "$(ls /dev/shm | grep "^$tag-" | paste -sd,)" "$(ls "$out" | grep ^shared- | paste -sd,)" > "$out/probe-$me.json"
' probe "$1"
"""


def nodes_state(want: str = "debug* idle", timeout: float = 60) -> dict[str, str]:
    """Node -> "PARTITION STATE", once every node is in `want` (a node still completing an earlier test's
    job is not yet idle) or `timeout` seconds have passed."""
    deadline = time.time() + timeout
    while True:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %P %t"], capture_output=True, text=True, timeout=30)
        states = {line.split()[0]: " ".join(line.split()[1:]) for line in out.stdout.splitlines()}
        if set(states.values()) == {want} or time.time() > deadline:
            return states
        time.sleep(0.5)


def test_each_node_is_a_host_of_its_own(slurm_cluster, tmp_path):
    assert nodes_state() == {n: "debug* idle" for n in NAMES}
    script = tmp_path / "probe.sh"
    script.write_text(PROBE.replace("${NAMES}", " ".join(NAMES)))
    job = sbatch(script, f"--nodes={NODES}", "--ntasks-per-node=1", f"--output={tmp_path / 'job.log'}",
                 args=(str(tmp_path),))
    try:
        assert wait_done(job, timeout=120) == {job: "COMPLETED"}, (tmp_path / "job.log").read_text()
    finally:
        cancel(job)
    probes = {n: json.loads((tmp_path / f"probe-{n}.json").read_text()) for n in NAMES}
    for name, p in probes.items():
        assert p["host"] == name
        assert p["addr"] == f"{ADDRS[name]}/24"
        assert p["resolved"] == ",".join(ADDRS[n] for n in NAMES)  # every name, on every node
        assert p["routes"].split() == f"198.18.0.0/24 dev eth0 proto kernel scope link src {ADDRS[name]}".split(), \
            "one route: the nodes' subnet (no default route)"
        mine = f"rr-probe-{job}-{name}"  # the other node's file, written before, is not there
        assert p["tmp"] == mine and p["shm"] == mine, "a /tmp and /dev/shm of its own"
        assert p["shared"] == ",".join(f"shared-{n}" for n in NAMES), "the shared file system is shared"
    assert not Path(f"/dev/shm/rr-probe-{job}-{NAMES[0]}").exists(), "the machine's /dev/shm is its own"
    assert not Path(f"/tmp/rr-probe-{job}-{NAMES[0]}").exists(), "the machine's /tmp is its own"
    on_node = subprocess.run(["bash", str(ON_NODE), "2", "hostname"], capture_output=True, text=True, timeout=30)
    assert on_node.stdout.strip() == NAMES[1], on_node.stderr


def leftovers() -> list[str]:
    """What a stopped cluster must not leave: namespaces, links, daemons, the nodes' mounts."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith("rrnode")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines()
              if line.split(":")[1].strip().startswith(("rrslurm", "rrveth"))]
    procs = subprocess.run(["ps", "-eo", "comm="], capture_output=True, text=True).stdout.split()
    found += [f"process {p}" for p in procs if p in ("slurmd", "slurmctld", "slurmstepd")]
    found += [f"mount {line.split()[1]}" for line in Path("/proc/mounts").read_text().splitlines()
              if "rrnode" in line]
    return found


def test_stop_leaves_nothing_and_start_brings_the_cluster_back(slurm_cluster):
    stop = subprocess.run(["bash", str(STOP)], capture_output=True, text=True, timeout=120)
    try:
        assert stop.returncode == 0, stop.stderr
        assert leftovers() == []
        assert not Path("/var/tmp/rrtrain-slurm").exists()
    finally:
        start = subprocess.run(["bash", str(START), "--nodes", str(NODES)], capture_output=True, text=True,
                               timeout=300)
    assert start.returncode == 0, start.stderr
    assert nodes_state() == {n: "debug* idle" for n in NAMES}
    with open(SESSION_LOCK, "a") as other:  # this session still holds the cluster: a second one is refused
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)

"""One run across two nodes of the local cluster (two hosts, each its own address, hostname, /tmp and /dev/shm),
two ranks per node, by both launch paths: slurm/multinode.sbatch (one torchrun agent per node, a c10d
rendezvous on the first node at the job's own port) and `rrtrain sweep --executor slurm` (submitit: one srun
task per rank). Every rank records its host (RUN/ranks/): both hosts appear, ranks 0-1 on the first node and
2-3 on the second; under HSDP (dp_shard=2 x dp_replicate=2) each shard group is therefore one node's ranks and
the replicas cross nodes; the losses equal those of the same config on 4 ranks of one machine within the FSDP
parity bound (tests/distributed/test_fsdp.py). While each job runs, every TCP socket its processes listen on,
on either node, is bound to that node's own address: the stores (torchrun's rendezvous and shared stores,
rank 0's store under submitit) and gloo's listeners, none on every interface or on loopback.

The time-limit path, by both: the sbatch script's batch shell gets the warning and has Slurm deliver TERM to
the step, and the script requeues the job; Slurm's own warning to a 2-node submitit job (USR2 to every task on
both nodes) has rank 0 requeue it through submitit. Either way all four ranks checkpoint at one step boundary
and the run resumes on both nodes, each step recorded once; the submitit run ends with the 4-rank run's losses
on one machine bit for bit (the sbatch run within the parity bound). One sweep config serves all three runs."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from launchers.executors.entry import rendezvous_path
from launchers.torchrun import rendezvous
from rrtrain.config import load_config
from rrtrain.parallel.mesh import mesh_shape
from rrtrain.rundir import ranks
from slurmutil import (ACTIVE, NODES, REPO, cancel, elapsed_s, held, job_logs, node_address, node_listening,
                       node_processes, restarts, rrtrain, sbatch, set_time_limit, squeue, submitted_jobs, sweep_file,
                       wait_done, wait_signalled)
from trainutil import PY, env, final, losses, max_rel_diff, prep_stories, records, train

pytestmark = pytest.mark.distributed

BOUND = 1e-4  # tests/distributed/test_fsdp.py's parity bound
STEPS = 16
RUN = "tiny-review-s0"
# a stop is agreed on every 2 steps (the default 10 would let the requeued run stop only at step 10 or 20)
OVERRIDES = {"parallel.backend": "fsdp", "parallel.dp_shard": 2, "parallel.dp_replicate": 2, "train.micro_batch": 2,
             "train.stop_check_every": 2}
RESOURCES = {"nodes": NODES, "tasks_per_node": 2, "cpus_per_task": 1, "mem_gb": 1, "time_min": 10}


@pytest.fixture(scope="module")
def zstd_data(shared_root: Path) -> Path:
    """A compressed dataset: read through a local cache, which each node must keep for itself (its ranks
    coordinate through that node's shared memory, which the other node cannot see)."""
    return prep_stories(shared_root / "two-node-zstd", compression="zstd")


@pytest.fixture(scope="module")
def two_node_sweep(shared_root: Path, zstd_data: Path) -> Path:
    """The sweep's directory, its run's config written (a dry run); nothing submitted yet."""
    root = shared_root / "two-node"
    root.mkdir()
    spec = sweep_file(root / "sweep.yaml", zstd_data, variants=["review"], steps=STEPS, resources=RESOURCES,
                      overrides=OVERRIDES)
    proc = rrtrain("sweep", str(spec), "--out", str(root / "sweep"), "--dry-run", env=env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


@pytest.fixture(scope="module")
def one_machine(two_node_sweep: Path, zstd_data: Path) -> dict[int, float]:
    """The reference: the same config on 4 ranks of this machine (srun-style ranks forked by the fork server:
    what is compared is the run's parallelism, not how its ranks started)."""
    run = two_node_sweep / "one-machine"
    train(run, zstd_data, nproc=4, config=str(config_of(two_node_sweep)))
    return losses(run)


def config_of(root: Path) -> Path:
    return root / "sweep" / "configs" / f"{RUN}.yaml"


class Listening:
    """What the job's processes (command lines containing `needle`) listen on, node by node, sampled while it
    runs, and the MASTER_PORT its ranks started with (torchrun's shared store)."""

    def __init__(self, needle: str) -> None:
        self.needle = needle
        self.seen: dict[str, set[tuple[str, int]]] = {f"rrnode{i}": set() for i in range(1, NODES + 1)}
        self.master_ports: set[int] = set()

    def __call__(self) -> None:
        for ns, found in self.seen.items():
            found |= node_listening(ns, self.needle)
            for pid in node_processes(ns, self.needle):
                with contextlib.suppress(OSError):
                    env_vars = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    self.master_ports |= {int(v[12:]) for v in env_vars if v.startswith(b"MASTER_PORT=")}

    def check(self, *store_ports: int) -> None:
        """Every listening socket on its node's own address; the stores (`store_ports`, and the MASTER_PORT the
        ranks started with, where they did) on the first node's."""
        for ns, found in self.seen.items():
            addr = node_address(ns)
            assert found and {a for a, _ in found} == {addr}, \
                f"{ns}: the job listens on {sorted(found)}, not on {addr} only"
        stores = {(node_address("rrnode1"), port) for port in (*self.master_ports, *store_ports)}
        assert stores <= self.seen["rrnode1"], (stores, self.seen)


def check_spans_two_nodes(run: Path, job: str, reference: dict[int, float]) -> None:
    fin = final(run)
    assert fin["status"] == "completed" and fin["world_size"] == 4 and fin["step"] == STEPS, fin
    by_rank = {r["rank"]: r for r in ranks.read(run)}
    assert {k: v["host"] for k, v in by_rank.items()} == {0: "rrnode1", 1: "rrnode1", 2: "rrnode2", 3: "rrnode2"}
    assert [by_rank[k]["local_rank"] for k in range(4)] == [0, 1, 0, 1]
    assert {v["job_id"].split("_")[0] for v in by_rank.values()} == {job.split("_")[0]}
    replicate, shard = 2, 2  # the config's mesh (test_hsdp_mesh_of_the_sweep_config_is_2_by_2)
    # DeviceMesh (replicate, shard) is row-major: shard group g holds ranks g*shard .. g*shard+shard-1
    for group in range(replicate):
        members = range(group * shard, (group + 1) * shard)
        assert len({by_rank[r]["host"] for r in members}) == 1, f"shard group {list(members)} spans nodes"
    assert len({by_rank[g * shard]["host"] for g in range(replicate)}) == replicate, "replicas cross nodes"
    assert sorted(losses(run)) == list(range(1, STEPS + 1))
    assert max_rel_diff(reference, losses(run)) < BOUND
    caches = sorted(p.name for p in (run / "data_cache").iterdir())
    assert caches == ["rrnode1", "rrnode2"], f"one loader cache per node, not {caches}"


def training_ranks(run: Path, job: str, logs: Callable[[], str], each: Callable[[], None] | None = None) -> list[int]:
    """The pids of the run's four ranks once it has logged its second step. The run is 16 steps, a few seconds
    of training on a quiet machine, so the files are read every 50 ms and the slower checks (the job still
    active, `each`: what the test samples while the job runs) made once a second."""
    deadline, checked = time.time() + 400, 0.0
    while max(losses(run), default=0) < 2 or len(ranks.read(run)) < 4:
        if time.time() - checked >= 1:
            assert time.time() < deadline and squeue(job).get(job) in ACTIVE, (squeue(job), logs())
            if each is not None:
                each()
            checked = time.time()
        time.sleep(0.05)
    return [r["pid"] for r in ranks.read(run)]


def test_hsdp_mesh_of_the_sweep_config_is_2_by_2(two_node_sweep):
    assert mesh_shape(load_config(str(config_of(two_node_sweep)), []).parallel, 4) == (2, 2)


def test_multinode_sbatch_two_nodes_two_ranks_each(slurm_cluster, two_node_sweep, one_machine):
    """slurm/multinode.sbatch, and its time-limit path: the warning goes to the batch shell (`--signal=B:USR2`,
    sent here with `scancel --batch --signal=USR2`), which has Slurm deliver TERM to every process of the step
    (the agents forward it to their ranks, which get it too). The four ranks checkpoint collectively at one step
    boundary, the script requeues the 2-node job, and the run resumes on both nodes and ends with every step
    once, instead of USR2 killing the torchrun agents and losing the run. The ranks are held (SIGSTOP) until
    the TERM has reached each of them, so that it falls mid-run however fast the machine trains."""
    run, log = two_node_sweep / "sbatch-run", two_node_sweep / "sbatch.log"
    e = env()
    rdzv_dir = two_node_sweep / "rendezvous"  # the script draws the job's rendezvous here, and removes it after
    e.update(RRTRAIN_PYTHON=PY, RRTRAIN_RUN_DIR=str(run), RRTRAIN_NPROC_PER_NODE="2", RDZV_DIR=str(rdzv_dir))
    job = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1",
                 "--cpus-per-task=2", "--mem=3G", "--time=10", f"--output={log}", "--job-name=rr-2node",
                 args=(str(config_of(two_node_sweep)), f"run.dir={run}"), env=e)
    listening = Listening("rrtrain.train")  # the torchrun agents and their ranks
    try:
        pids = training_ranks(run, job, lambda: log.read_text() if log.exists() else "", each=listening)
        with held(pids):
            held_at = max(losses(run))
            listening()  # the first start's sockets, still open while its ranks are held
            subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, capture_output=True, timeout=30)
            wait_signalled(pids, signal.SIGTERM, timeout=60)
        states = wait_done(job, timeout=400, each=listening)
    finally:
        cancel(job)
    text = log.read_text() if log.exists() else ""
    assert states == {job: "COMPLETED"} and restarts(job) == 1, text[-4000:]
    assert "checkpointed" in text and "requeueing" in text, text[-4000:]
    assert held_at <= int(text.split("resumed at step ")[1].split()[0]) < STEPS, text[-4000:]
    drawn = [int(port) for port in re.findall(rf"{NODES} nodes x 2, rendezvous rrnode1:(\d+),", text)]
    assert len(drawn) == 2, text[:2000]  # one rendezvous drawn for each start of the job
    assert all(rendezvous.PORTS[0] <= port <= rendezvous.PORTS[1] for port in drawn)
    assert rdzv_dir.is_dir() and not any(rdzv_dir.iterdir()), "the drawn rendezvous file stays"
    check_spans_two_nodes(run, job, one_machine)
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
    assert 1 <= len(listening.master_ports) <= 2, listening.master_ports  # torchrun's shared store, each start
    listening.check(*drawn)


def test_sweep_executor_slurm_two_nodes_through_slurms_time_limit_warning(slurm_cluster, two_node_sweep, one_machine):
    """`rrtrain sweep --executor slurm` (submitit: one srun task per rank) on two nodes, through Slurm's own
    time-limit warning (submitit's `--signal=USR2@S`, S the sweep's `signal_delay_s`, 120 s), which goes to every
    task of the job's steps on every node and has rank 0 requeue the job through submitit. Slurm checks time
    limits every 30 s and its least limit is a minute, while starting four ranks here takes longer: the job starts
    with the sweep's 10 minutes, and once it trains the test cuts the limit to 1-2 minutes from now, so that the
    warning comes at Slurm's next check. The four ranks are held (SIGSTOP; Slurm continues a task it signals)
    until the warning has reached every one of them, so it falls mid-run however fast the machine trains; once
    requeued, the limit is given back. The run ends with the losses of the 4 ranks on one machine, bit for bit:
    the requeue lost nothing, and two nodes compute what one does."""
    out = two_node_sweep / "sweep"
    proc = rrtrain("sweep", str(two_node_sweep / "sweep.yaml"), "--out", str(out), "--executor", "slurm", env=env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = submitted_jobs(out)[-1][RUN]
    run = out / RUN
    listening = Listening("submitit")  # the srun tasks: the ranks
    stops: list[dict] = []  # final.json as the first allocation left it
    try:
        deadline = time.time() + 400
        pids = training_ranks(run, job, lambda: job_logs(out), each=listening)
        with held(pids):
            held_at = max(losses(run))
            listening()  # the first start's sockets, still open while its ranks are held
            set_time_limit(job, elapsed_s(job) // 60 + 2)  # 60-120 s left: less than the warning's 120
            wait_signalled(pids, signal.SIGUSR2, timeout=90)  # Slurm's next time-limit check, within 30 s
        while not stops:
            assert time.time() < deadline and squeue(job).get(job) in ACTIVE, (squeue(job), job_logs(out))
            if restarts(job) >= 1:
                stops.append(final(run))
            time.sleep(0.2)
        set_time_limit(job, 30)  # long enough that a slow second run gets no second warning
        states = wait_done(job, timeout=400, each=listening)
    finally:
        cancel(job)
    logs = job_logs(out)
    assert states == {job: "COMPLETED"} and restarts(job) == 1, logs
    [stop] = stops
    assert stop["status"] == "preempted" and stop["signal"] == "SIGUSR2" and held_at <= stop["step"] < STEPS, stop
    assert stop["world_size"] == 4
    assert f"resumed at step {stop['step']}" in logs, logs
    check_spans_two_nodes(run, job, one_machine)
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
    assert losses(run) == one_machine, (losses(run), one_machine)
    assert {r["restart"] for r in ranks.read(run)} == {1}
    # rank 0's store listens at the port drawn at submission (mode 600, beside submitit's files), not submitit's
    # own (random.Random(job id), which anyone who sees the job id can work out); the entry point sets it once
    # the task runs, so it is not in the tasks' environment at start
    drawn = rendezvous_path(out, RUN)
    assert stat.S_IMODE(drawn.stat().st_mode) == 0o600
    listening.check(rendezvous.read(drawn).port)
    status = rrtrain("status", str(out), "--json", env=env())
    assert status.returncode == 0, status.stderr
    assert [r["nodes"] for r in json.loads(status.stdout)["runs"] if r["id"] == RUN] == [["rrnode1", "rrnode2"]]

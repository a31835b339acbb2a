"""One run across two nodes of the local cluster (two hosts, each its own address, hostname, /tmp and /dev/shm),
two ranks per node, by both launch paths: slurm/multinode.sbatch (one torchrun agent per node, a c10d
rendezvous on the first node at the job's own port) and `rrtrain sweep --executor slurm` (submitit: one srun
task per rank). Every rank records its host (RUN/ranks/): both hosts appear, ranks 0-1 on the first node and
2-3 on the second; under HSDP (dp_shard=2 x dp_replicate=2) each shard group is therefore one node's ranks and
the replicas cross nodes; the losses equal those of the same config on 4 ranks of one machine within the FSDP
parity bound (tests/distributed/test_fsdp.py). While each job runs, every TCP socket its processes listen on,
on either node, is bound to that node's own address: the stores (torchrun's rendezvous and shared stores,
rank 0's store under submitit) and gloo's listeners, none on every interface or on loopback.

Each job is also interrupted once mid-run, and requeued, so one job per launch path proves both its start and
its requeue (a two-node job costs some 6 fresh interpreters per attempt on two shared cores):
- slurm/multinode.sbatch: the time-limit warning goes to the batch shell (`--signal=B:USR2`, sent here with
  `scancel --batch --signal=USR2`), which forwards it as TERM through srun to the agents and their ranks; the
  ranks checkpoint collectively, the script requeues the 2-node job, and the run resumes and finishes
  exactly, instead of USR2 killing the torchrun agents and losing the step.
- submitit: Slurm's own time-limit warning of a 2-node job (submitit's `--signal=USR2@S`: USR2 to every task
  on both nodes) makes all four ranks agree at a step boundary, save collectively (FSDP, gloo) and exit 75; rank
  0 requeues the job through submitit, and the run resumes on both nodes on the next allocation.
  Slurm checks time limits every 30 s and its least limit is one minute, while this machine needs 15-30 s to
  start the ranks: a job submitted with a one-minute limit would get its warning before it trains. So the job
  starts with a long limit, and once it trains the test shortens the limit to 1-2 minutes from now (Slurm then
  sends the USR2 at its next check, within about 30 s); once requeued, the long limit is given back for the
  second attempt.
Both runs end with the losses of the uninterrupted run of the same config (4 ranks of one machine), bit for
bit, each step recorded once. While a signal is on its way every rank is held (SIGSTOP; Slurm continues a
task it signals), so it falls mid-run however fast the machine trains. One sweep config serves all three
runs."""

from __future__ import annotations

import contextlib
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from launchers.executors.entry import rendezvous_path
from launchers.torchrun import rendezvous
from rrtrain.config import load_config
from rrtrain.parallel.mesh import mesh_shape
from rrtrain.rundir import ranks
from slurmutil import (ACTIVE, NODES, REPO, cancel, elapsed_s, held, job_logs, node_address, node_listening,
                       node_processes, restarts, rrtrain, sbatch, set_time_limit, squeue, status, submitted_jobs,
                       sweep_file, wait_done, wait_signalled)
from trainutil import (PY, env, final, free_port, losses, max_rel_diff, prep_stories, records, spawn, train_cmd,
                       wait_ranks)

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
    """The reference: the same config on 4 ranks of this machine (srun-style ranks forked by the fork server,
    as tests/trainutil.py's start_ranks starts them: this run is the reference, not the launcher under test)."""
    run, port = two_node_sweep / "one-machine", free_port()
    procs = []
    for rank in range(4):
        e = env()
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="4",
                 LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="4")
        procs.append(spawn(train_cmd(run, zstd_data, [], config=str(config_of(two_node_sweep))), e,
                           merge_stderr=False))
    code, out, err = wait_ranks(procs, timeout=600)
    assert code == 0, (out + err)[-4000:]
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


def test_hsdp_mesh_of_the_sweep_config_is_2_by_2(two_node_sweep):
    assert mesh_shape(load_config(str(config_of(two_node_sweep)), []).parallel, 4) == (2, 2)


def hold_and_signal(run: Path, job: str, listening: Listening, send, sig: int, logs, within: float = 60) -> int:
    """Once all 4 ranks train (step 2 or later): hold them (SIGSTOP), sample what the job listens on, have the
    signal sent (`send()`) and let them go once `sig` has reached every rank (within `within` s). Returns the step
    they were held at: the stop comes at or after it."""
    deadline = time.time() + 300
    while max(losses(run), default=0) < 2 or len(ranks.read(run)) < 4:
        assert time.time() < deadline and squeue(job).get(job) in ACTIVE, (squeue(job), logs())
        time.sleep(0.1)
    pids = [r["pid"] for r in ranks.read(run)]
    with held(pids):
        held_at = max(losses(run))
        listening()  # the first attempt, every listener up
        send()
        wait_signalled(pids, sig, timeout=within)
    return held_at


def test_multinode_sbatch_two_nodes_two_ranks_each_and_usr2_to_the_batch_shell_requeues(slurm_cluster,
                                                                                        two_node_sweep, one_machine):
    run, log = two_node_sweep / "sbatch-run", two_node_sweep / "sbatch.log"
    e = env()
    rdzv_dir = two_node_sweep / "rendezvous"  # the script draws the job's rendezvous here, and removes it after
    e.update(RRTRAIN_PYTHON=PY, RRTRAIN_RUN_DIR=str(run), RRTRAIN_NPROC_PER_NODE="2", RDZV_DIR=str(rdzv_dir))
    job = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1",
                 "--cpus-per-task=2", "--mem=3G", "--time=10", f"--output={log}", "--job-name=rr-2node",
                 args=(str(config_of(two_node_sweep)), f"run.dir={run}"), env=e)
    listening = Listening("rrtrain.train")  # the torchrun agents and their ranks
    try:
        # the batch shell's trap forwards USR2 as TERM to the job step: every agent and rank
        usr2 = ["scancel", "--batch", "--signal=USR2", job]
        held_at = hold_and_signal(run, job, listening, lambda: subprocess.run(usr2, check=True, capture_output=True,
                                                                              timeout=30),
                                  signal.SIGTERM, lambda: log.read_text() if log.exists() else "")
        states = wait_done(job, timeout=400, each=listening)
    finally:
        cancel(job)
    text = log.read_text() if log.exists() else ""
    assert states == {job: "COMPLETED"}, text[-4000:]
    assert restarts(job) == 1, text[-4000:]
    assert "checkpointed" in text and "requeueing" in text, text[-4000:]
    resumed = int(text.split("resumed at step ")[1].split()[0])
    assert held_at <= resumed < STEPS, (held_at, resumed)
    drawn = re.findall(rf"{NODES} nodes x 2, rendezvous rrnode1:(\d+), restart (\d+),", text)
    assert [r for _, r in drawn] == ["0", "1"], text[:4000]  # one rendezvous drawn per start of the job
    rdzv_ports = [int(p) for p, _ in drawn]
    assert all(rendezvous.PORTS[0] <= p <= rendezvous.PORTS[1] for p in rdzv_ports)
    assert rdzv_dir.is_dir() and not any(rdzv_dir.iterdir()), "the drawn rendezvous file stays"
    check_spans_two_nodes(run, job, one_machine)
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
    assert losses(run) == one_machine, "the resumed run's losses, bit for bit"
    assert {r["restart"] for r in ranks.read(run)} == {1}
    assert len(listening.master_ports) == 2, listening.master_ports  # torchrun's shared store, per attempt
    listening.check(*rdzv_ports)


def test_sweep_executor_slurm_two_nodes_two_ranks_each_and_the_time_limit_warning_requeues_exactly(
        slurm_cluster, two_node_sweep, one_machine):
    out = two_node_sweep / "sweep"
    e = env()
    proc = rrtrain("sweep", str(two_node_sweep / "sweep.yaml"), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = submitted_jobs(out)[-1][RUN]
    run = out / RUN
    listening = Listening("submitit")  # the srun tasks: the ranks
    try:
        # 60-120 s left, less than the sweep's signal_delay_s (120): Slurm warns at its next check, within 30 s
        held_at = hold_and_signal(run, job, listening, lambda: set_time_limit(job, elapsed_s(job) // 60 + 2),
                                  signal.SIGUSR2, lambda: job_logs(out), within=90)
        deadline = time.time() + 300
        while restarts(job) < 1:
            assert time.time() < deadline and squeue(job).get(job) in ACTIVE, (squeue(job), job_logs(out))
            time.sleep(0.2)
        stop = final(run)  # as the first allocation left it
        set_time_limit(job, 30)  # long enough that a slow second attempt gets no second warning
        states = wait_done(job, timeout=400, each=listening)
    finally:
        cancel(job)
    logs = job_logs(out)
    assert states == {job: "COMPLETED"} and restarts(job) == 1, logs
    assert stop["status"] == "preempted" and stop["signal"] == "SIGUSR2" and held_at <= stop["step"] < STEPS, stop
    assert stop["world_size"] == 4
    assert f"resumed at step {stop['step']}" in logs, logs
    check_spans_two_nodes(run, job, one_machine)
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
    assert losses(run) == one_machine, "the resumed run's losses, bit for bit"
    by_rank = {r["rank"]: r for r in ranks.read(run)}
    assert {k: (v["host"], v["restart"]) for k, v in by_rank.items()} == {
        0: ("rrnode1", 1), 1: ("rrnode1", 1), 2: ("rrnode2", 1), 3: ("rrnode2", 1)}, by_rank
    # rank 0's store listens at the port drawn at submission (mode 600, beside submitit's files), not submitit's
    # own (random.Random(job id), which anyone who sees the job id can work out); the entry point sets it once
    # the task runs, so it is not in the tasks' environment at start
    drawn = rendezvous_path(out, RUN)
    assert stat.S_IMODE(drawn.stat().st_mode) == 0o600
    listening.check(rendezvous.read(drawn).port)
    [row] = status(out, e)["runs"]
    assert row["state"] == "completed" and row["step"] == STEPS and row["nodes"] == ["rrnode1", "rrnode2"], row

"""Helpers for the tests that run jobs on the local Slurm cluster (slurm/local/start.sh --nodes 2). There is no
accounting (no sacct) on that cluster: a job's state comes from squeue, which keeps finished jobs for
MinJobAge (300 s) after they end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("RRTRAIN_SLURM_DIR", "/var/tmp/rrtrain-slurm"))  # start.sh's state directory
#: the test session's hold on the cluster (conftest.py); beside STATE, not in it: stop.sh removes STATE
#: (test_cluster.py stops and starts the cluster mid-session), and a lock file removed under its holder would
#: let a second session take a new one and restart the cluster under the first one's jobs
SESSION_LOCK = STATE.parent / f"{STATE.name}.session.lock"
START = REPO / "slurm" / "local" / "start.sh"
STOP = REPO / "slurm" / "local" / "stop.sh"
ON_NODE = REPO / "slurm" / "local" / "on-node.sh"
NODES = 2  # the session's cluster (conftest.py): every test here shares it
#: monitor thresholds under which any run counts as stalled within a few steps: its loss must halve every 4
#: steps (min_improvement 0.9) and "near the unigram entropy" covers every loss (margin 100 nats)
STALL_AT_ONCE = {"monitor.min_steps": 5, "monitor.window": 4, "monitor.min_improvement": 0.9,
                 "monitor.entropy_margin": 100.0}
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
          "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}


def squeue(job: str) -> dict[str, str]:
    """State of every task of a job (array tasks as `JOBID_TASK`), finished ones included."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", str(job), "-o", "%i %T"], capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:
        return {}  # a job id squeue has already forgotten
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


def restarts(job: str) -> int:
    """How many times Slurm requeued the job (its restart count)."""
    out = subprocess.run(["scontrol", "show", "job", str(job)], capture_output=True, text=True, timeout=30)
    for field in out.stdout.split():
        if field.startswith("Restarts="):
            return int(field.split("=", 1)[1])
    return 0


def wait_state(job: str, want: set[str], timeout: float = 240, poll: float = 1.0) -> dict[str, str]:
    """Wait until every task of `job` is in one of the `want` states; returns the states."""
    deadline = time.time() + timeout
    states: dict[str, str] = {}
    while time.time() < deadline:
        states = squeue(job)
        if states and all(s in want for s in states.values()):
            return states
        time.sleep(poll)
    raise AssertionError(f"job {job} not in {sorted(want)} after {timeout} s: {states}")


def wait_done(job: str, timeout: float = 240, each: Callable[[], None] | None = None) -> dict[str, str]:
    """Wait until no task of `job` is pending, running or being requeued; returns the final states. `each` is
    called on every poll (twice a second) while the job is active: what a test watches while the job runs."""
    deadline = time.time() + timeout
    states: dict[str, str] = {}
    while time.time() < deadline:
        states = squeue(job)
        if states and not ACTIVE.intersection(states.values()):
            return states
        if each is None:
            time.sleep(1.0)
        else:
            each()
            time.sleep(0.5)
    raise AssertionError(f"job {job} still active after {timeout} s: {states}")


def cancel(*jobs: str) -> None:
    """Cancel jobs a test submitted (a no-op for finished ones), so a failing test leaves none behind."""
    if jobs:
        subprocess.run(["scancel", *map(str, jobs)], capture_output=True, timeout=30)


def sbatch(script: Path, *options: str, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> str:
    """Submit a batch script with sbatch `options` and the script's own `args`; returns the job id."""
    out = subprocess.run(["sbatch", "--parsable", *options, str(script), *args], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, f"sbatch failed: {out.stderr}"
    return out.stdout.strip().split(";")[0]


def sweep_file(path: Path, data: Path, *, variants: list[str], steps: int, resources: dict,
               overrides: dict | None = None, runs: dict | None = None, name: str = "t") -> Path:
    """A sweep of tiny runs (one seed per variant) on an already prepared dataset; `overrides` are training
    keys over the defaults here, `runs` training keys per run id."""
    import yaml

    spec = {
        "name": name, "config": str(REPO / "configs" / "train" / "tiny.yaml"), "data": str(data),
        "variants": variants, "sizes": {"tiny": {"seeds": 1, "overrides": {"train.max_steps": steps}}},
        "overrides": {"train.global_batch": 8, "train.micro_batch": 8, "train.log_every": 1,
                      "train.eval_every": 0, "train.ckpt_every": 0, "train.warmup_steps": 2,
                      "train.compile": False,  # "auto" would compile a run of 10,000 steps or more on CPU
                      **(overrides or {})},
        "resources": {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 2, **resources},
        "runs": runs or {},
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rrtrain(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m rrtrain ARGS` (the console script's code, from this checkout), forked by the tests' fork server
    where one serves (trainutil.run_cmd): what it submits runs in Slurm's jobs, not in this process."""
    from trainutil import PY, run_cmd

    return run_cmd([PY, "-m", "rrtrain", *args], env, timeout, module="rrtrain")


def submitted_jobs(out: Path) -> list[dict[str, str]]:
    """Run id -> job id, one dict per submission recorded in sweep.json."""
    import json

    return [sub["jobs"] for sub in json.loads((out / "sweep.json").read_text())["submissions"]]


def status(out: Path, env: dict[str, str]) -> dict:
    import json

    proc = rrtrain("status", str(out), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def job_logs(out: Path, tail: int = 3000) -> str:
    """The tail of every job log of a sweep (submitit's stdout and stderr per task), for a failing assertion."""
    parts = []
    for log in sorted((Path(out) / "slurm").rglob("*_log.*")):
        text = log.read_text(errors="replace")
        parts.append(f"--- {log.relative_to(out)} (last {tail} chars)\n{text[-tail:]}")
    return "\n".join(parts) or f"no job logs under {out}/slurm"


def elapsed_s(job: str) -> int:
    """How long the job has been running (squeue's TIME: [D-]H:MM:SS or M:SS)."""
    out = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%M"], capture_output=True, text=True, timeout=30)
    text = out.stdout.strip()
    days, _, clock = text.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + 86400 * int(days or 0)


def node_processes(ns: str, needle: str) -> list[int]:
    """The processes of a node (its network namespace) whose command line contains `needle`."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()
    found = []
    for pid in map(int, out):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            found.append(pid)
    return found


def node_listening(ns: str, needle: str) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket listening in node `ns` (its network namespace) that a Python process
    whose command line contains `needle` holds (not srun, whose command line names the job's too): read from the
    node's own /proc/PID/net/tcp{,6}, which psutil, reading the machine's, cannot see."""
    pids = [pid for pid in node_processes(ns, needle) if _is_python(pid)]
    inodes: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(int(link[8:-1]))
    found: set[tuple[str, int]] = set()
    if not pids:
        return found
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError):  # any process of the namespace sees all of its sockets
            for line in Path(f"/proc/{pids[0]}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[9]) in inodes:  # 0A: LISTEN
                    found.add(_address(fields[1], family))
    return found


def _is_python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def node_address(ns: str) -> str:
    """Node `ns`'s address, from the hosts file every node of the local cluster sees (slurm/local/nodes.sh)."""
    for line in (STATE / "hosts").read_text().splitlines():
        addr, *names = line.split()
        if ns in names:
            return addr
    raise AssertionError(f"{ns} is not in {STATE / 'hosts'}")


def _address(hex_addr: str, family: int) -> tuple[str, int]:
    """/proc/net/tcp's `0100007F:1F90` (the address in 32-bit words of host byte order, little-endian here)."""
    addr, port = hex_addr.split(":")
    raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
    return socket.inet_ntop(family, raw), int(port, 16)


def set_time_limit(job: str, minutes: int) -> None:
    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=True,
                   capture_output=True, timeout=30)


@contextlib.contextmanager
def held(pids: list[int]) -> Iterator[None]:
    """The processes stopped (SIGSTOP) for the block and let go (SIGCONT) after it, also when it fails. A test
    that holds a trainer while a scheduler's warning is on its way decides the step the warning acts on,
    whatever the machine's speed: the run need not be long enough to outlast the scheduler's timer."""
    try:
        stop(pids)
        yield
    finally:
        let_go(pids)


def stop(pids: list[int]) -> None:
    """SIGSTOP, returning once each process has stopped (or is gone)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.time() + 10
    while not all(_state(pid) in ("T", None) for pid in pids):
        assert time.time() < deadline, f"{pids} did not stop"
        time.sleep(0.01)


def let_go(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def children(pid: int) -> list[int]:
    """The live (not yet reaped, not zombie) children of a process, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            status = _status(int(entry.name))
            if status and status.get("PPid") == str(pid) and status["State"][:1] != "Z":
                found.append(int(entry.name))
    return found


def _status(pid: int) -> dict[str, str] | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return dict((k, v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines()))


def _state(pid: int) -> str | None:
    status = _status(pid)
    return status["State"][:1] if status else None


def ended(pid: int) -> bool:
    """Whether a process has exited (a zombie its stopped parent has not reaped, or gone)."""
    return _state(pid) in ("Z", None)


def signalled(pid: int, sig: int) -> bool:
    """Whether `sig` reached a process `held` stopped: pending while it stays stopped (submitit's
    LocalExecutor), or handled already: Slurm continues a stopped task after signalling it, so a held task that
    runs again, or has ended, has had it."""
    status = _status(pid)
    if status is None or status["State"][:1] != "T":
        return True
    return any(int(status[key], 16) >> (sig - 1) & 1 for key in ("ShdPnd", "SigPnd"))


def wait_signalled(pids: list[int], sig: int, timeout: float) -> None:
    deadline = time.time() + timeout
    while not all(signalled(pid, sig) for pid in pids):
        assert time.time() < deadline, f"no {signal.Signals(sig).name} reached {pids} within {timeout} s"
        time.sleep(0.2)

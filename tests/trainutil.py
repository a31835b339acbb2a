"""Helpers shared by the tests that run real training jobs (one process or torchrun on CPU/gloo)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Union

import torch

import forkserver
import tiers

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TINY = str(REPO / "configs" / "train" / "tiny.yaml")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e["PYTHONUNBUFFERED"] = "1"
    return e


def prep_stories(out: Path, num_docs: int = 400, seq_len: int = 64, seed: int = 0, compression: str = "none") -> Path:
    """A small byte-level dataset from the built-in synthetic stories (zstd: read through each node's cache), by
    `rrtrain prep` in a process of its own (forked by the fork server where one serves: run_cmd)."""
    cmd = [PY, "-m", "rrtrain", "prep", "--source", "synthetic:stories", "--tokenizer", "byte",
           "--seq-len", str(seq_len), "--num-docs", str(num_docs), "--out", str(out), "--seed", str(seed),
           "--compression", compression]
    proc = run_cmd(cmd, env(), timeout=300, module="rrtrain")
    assert proc.returncode == 0, f"rrtrain prep exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_cmd(run_dir: Path, data: Optional[Path], overrides: list[str], nproc: int = 1, config: str = TINY) -> list[str]:
    """`data`: the run's data.path; None where the overrides name the data (`data.sources=[...]`)."""
    args = [config, *([f"data.path={data}"] if data is not None else []), f"run.dir={run_dir}", *overrides]
    if nproc == 1:
        return [PY, "-m", "rrtrain.train", *args]
    return [PY, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", "-m", "rrtrain.train", *args]


Process = Union[subprocess.Popen, forkserver.Forked]
# Fork servers of this pytest process, by the environment their interpreter started with (what Python, torch and
# OpenMP read when they start: forkserver.startup_env). A library a test imports in this process may add such a
# variable to os.environ for good (KMP_INIT_AT_FORK, ...); its runs then get a server of their own.
_servers: dict[frozenset, forkserver.Client] = {}
_asked: dict[frozenset, int] = {}
_failed: set[frozenset] = set()
_servers_lock = threading.Lock()  # a test may start runs from several threads
MAX_SERVERS = 3
_DEFAULT = frozenset(forkserver.startup_env(env()).items())  # this process's own: served from the first run


def _forks(cmd: list[str], module: str = "rrtrain.train") -> bool:
    """Whether `cmd` may run as a child of a fork server (tests/forkserver.py): a one-process
    `python -m MODULE`, outside the fast tier (whose guard watches Popen), unless RRTRAIN_TEST_FORKSERVER=0."""
    return (cmd[:3] == [PY, "-m", module] and os.environ.get(forkserver.ENV_SWITCH, "1") != "0"
            and not tiers.fast_tier() and hasattr(os, "fork"))


def _server_for(environ: dict[str, str]) -> Optional[forkserver.Client]:
    """The server for `environ`'s start-up variables; started on the first run of this process's own and on the
    second of any other (a one-off, such as a test's PYTHONPATH, does not repay a server), at most MAX_SERVERS."""
    key = frozenset(forkserver.startup_env(environ).items())
    with _servers_lock:
        server = _servers.get(key)
        if server is None:
            _asked[key] = _asked.get(key, 0) + 1
            if (key != _DEFAULT and _asked[key] < 2) or len(_servers) >= MAX_SERVERS or key in _failed:
                return None
            try:
                server = _servers[key] = forkserver.Client(PY, environ, str(REPO))
            except (OSError, RuntimeError) as err:  # no server: the runs start as plain processes
                print(f"tests: no fork server ({err}); training runs start as new processes", file=sys.stderr)
                _failed.add(key)
                return None
            if len(_servers) == 1:
                atexit.register(stop_server)  # pytest_unconfigure (tests/conftest.py) stops them first
    return server if server.serves(environ) else None


def spawn(cmd: list[str], environ: dict[str, str], merge_stderr: bool, fresh: bool = False,
          cwd: Optional[Path] = None, module: str = "rrtrain.train") -> Process:
    """Start `cmd` in a session of its own, in `cwd` (the repository by default), with stdout and stderr piped
    (merged or not): forked by a fork server where one serves (`_forks` for `python -m MODULE`, `_server_for`), else a
    plain subprocess. `fresh`: always a plain subprocess (a test of what a new interpreter does at start-up)."""
    folder = cwd if cwd is not None else REPO
    server = _server_for(environ) if not fresh and _forks(cmd, module) else None
    if server is not None:
        return server.start(cmd, environ, str(folder), merge_stderr)
    return subprocess.Popen(cmd, cwd=folder, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True,
                            start_new_session=True)


def run_cmd(cmd: list[str], environ: dict[str, str], timeout: float, fresh: bool = False,
            cwd: Optional[Path] = None, module: str = "rrtrain.train") -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout) in `cwd` (the repository by default),
    through spawn (`python -m MODULE` is forked by the fork server); on timeout the process tree is killed."""
    proc = spawn(cmd, environ, merge_stderr=False, fresh=fresh, cwd=cwd, module=module)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stop_server() -> None:
    """End the fork servers (what they still run is killed) and reap them: their children's CPU time counts in
    ours."""
    with _servers_lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()


def start_ranks(run_dir: Path, data: Path, *overrides: str, world: int = 2, config: str = TINY) -> list[Process]:
    """Start `world` ranks of one run the way srun or submitit start them on one node: one process per rank
    sharing MASTER_ADDR/PORT, RANK and WORLD_SIZE, with no torchrun above them; each in its own session, output
    captured separately, forked by the fork server (see spawn)."""
    port = free_port()
    procs = []
    for rank in range(world):
        e = env()
        # the local rank and size submitit exports (streaming places its shared memory by them)
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                 LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        procs.append(spawn(train_cmd(run_dir, data, list(overrides), config=config), e, merge_stderr=False))
    return procs


def wait_ranks(procs: list[Process], timeout: float) -> tuple[int, str, str]:
    """Wait for every rank, as torchrun's agent does: the first rank to fail ends the others at once (they would
    wait on it in a collective), and so does the end of `timeout` (then TimeoutExpired). Returns the job's exit
    status (the first failed rank's, else 0) and the ranks' stdout and stderr, rank after rank."""
    outputs: dict[int, tuple[str, str]] = {}

    def end_the_rest() -> None:
        for i, p in enumerate(procs):
            if i not in outputs and p.poll() is None:
                kill_group(p)

    deadline = time.monotonic() + timeout
    failed: Optional[int] = None
    while len(outputs) < len(procs):
        if time.monotonic() > deadline:
            end_the_rest()
            raise subprocess.TimeoutExpired([p.args for p in procs], timeout)
        for i, p in enumerate(procs):  # in one thread: a Forked's exit status is read from one socket
            if i not in outputs:
                try:
                    out, err = p.communicate(timeout=0.05)
                except subprocess.TimeoutExpired:
                    continue
                outputs[i] = (out or "", err or "")
                if p.returncode and failed is None:
                    failed = p.returncode
                    end_the_rest()
    ranks = [outputs[i] for i in range(len(procs))]
    return failed or 0, "".join(out for out, _ in ranks), "".join(err for _, err in ranks)


def train(run_dir: Path, data: Path, *overrides: str, nproc: int = 1, timeout: float = 600,
          expect: Optional[int] = 0, fresh: bool = False, config: str = TINY) -> subprocess.CompletedProcess:
    """Run a training job to its end; check its exit status unless expect is None. One process: forked by the fork
    server unless `fresh` (see spawn). Several: srun-style ranks forked by the fork server (start_ranks), unless
    `fresh` (torchrun): what is tested here is the run's parallelism, and torchrun's start-up costs a new
    interpreter per rank and one for its agent; start() and the tests of launchers keep torchrun."""
    if nproc > 1 and not fresh:
        cmd = train_cmd(run_dir, data, list(overrides), nproc, config)
        status, out, err = wait_ranks(start_ranks(run_dir, data, *overrides, world=nproc, config=config), timeout)
        result = subprocess.CompletedProcess(cmd, status, out, err)
    else:
        result = run_cmd(train_cmd(run_dir, data, list(overrides), nproc, config), env(), timeout, fresh=fresh)
    if expect is not None and result.returncode != expect:
        raise AssertionError(f"exit {result.returncode} (expected {expect})\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}")
    return result


def start(run_dir: Path, data: Path, *overrides: str, nproc: int = 1, fresh: bool = False) -> Process:
    """Start a training job in its own process group (so a signal reaches every rank); stderr joins stdout.
    One process: forked by the fork server unless `fresh` (see spawn)."""
    return spawn(train_cmd(run_dir, data, list(overrides), nproc), env(), merge_stderr=True, fresh=fresh)


def wait_for_step(run_dir: Path, step: int, proc: Process, timeout: float = 300) -> int:
    """Poll metrics.jsonl until a training line with at least `step` appears; returns the step seen."""
    deadline = time.time() + timeout
    path = run_dir / "metrics.jsonl"
    while time.time() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read()[-4000:] if proc.stderr else ""
            raise AssertionError(f"the run ended (exit {proc.returncode}) before step {step}:\n"
                                 f"{proc.stdout.read()[-4000:]}\n{err}")
        seen = max((s for s in losses(run_dir)), default=0) if path.exists() else 0
        if seen >= step:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _tree(proc: Process) -> list:
    """`proc` and every process below it (psutil's), or nothing when it is gone."""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_all(targets: list, sig: int) -> None:
    import psutil

    for p in targets:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    if sig == signal.SIGKILL:
        psutil.wait_procs(targets, timeout=30)


def kill_group(proc: Process, sig: int = signal.SIGKILL) -> None:
    """Signal the launcher and every process below it. torchrun starts each rank in a session of its
    own, so signalling the launcher's process group alone would leave the ranks running."""
    tree = _tree(proc)
    _signal_all(tree if sig == signal.SIGKILL else tree[:1], sig)  # a SIGTERM to torchrun is forwarded by torchrun


def kill_all(procs: list[Process]) -> None:
    """SIGKILL the process trees of every one of `procs` at once (srun-style ranks have a session each: they die
    together, as the ranks of a killed torchrun job do), then wait for them."""
    _signal_all([p for proc in procs for p in _tree(proc)], signal.SIGKILL)


def records(run_dir: Path) -> list[dict]:
    out = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by a kill
    return out


def losses(run_dir: Path) -> dict[int, float]:
    """Training loss per step (the last occurrence of each step)."""
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}


def final(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "final.json").read_text())


def checkpoint_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model parameters of the run's latest checkpoint (DCP format), as full tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    root = Path(run_dir) / "checkpoints"
    ckpt = root / (root / "latest").read_text().strip() / "state"
    out = Path(run_dir) / "_params.pt"
    dcp_to_torch_save(ckpt, out)
    state = torch.load(out, weights_only=False)
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def max_rel_diff(a: dict[int, float], b: dict[int, float]) -> float:
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(abs(a[k] - b[k]) / abs(a[k]) for k in a)


def train_state(step: int, **more) -> dict:
    """The smallest train_state.json a checkpoint may hold (rrtrain.rundir.train_state checks it on reading)."""
    return {"step": step, "tokens": 0, "skipped": 0, "wall_s": 0.0, "best_val_loss": float("inf"),
            "last_val_loss": None, "loader": {"samples_consumed": 0}, "config": {}, "world_size": 1, **more}

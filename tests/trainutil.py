"""Helpers shared by the tests that run real training jobs (one process or torchrun on CPU/gloo)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TINY = str(REPO / "configs" / "train" / "tiny.yaml")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e["PYTHONUNBUFFERED"] = "1"
    return e


def prep_stories(out: Path, num_docs: int = 400, seq_len: int = 64, seed: int = 0, compression: str = "none") -> Path:
    """A small byte-level dataset from the built-in synthetic stories (zstd: read through each node's cache)."""
    cmd = [PY, "-m", "rrtrain", "prep", "--source", "synthetic:stories", "--tokenizer", "byte",
           "--seq-len", str(seq_len), "--num-docs", str(num_docs), "--out", str(out), "--seed", str(seed),
           "--compression", compression]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"rrtrain prep exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_cmd(run_dir: Path, data: Path, overrides: list[str], nproc: int = 1, config: str = TINY) -> list[str]:
    args = [config, f"data.path={data}", f"run.dir={run_dir}", *overrides]
    if nproc == 1:
        return [PY, "-m", "rrtrain.train", *args]
    return [PY, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", "-m", "rrtrain.train", *args]


def train(run_dir: Path, data: Path, *overrides: str, nproc: int = 1, timeout: float = 600,
          expect: Optional[int] = 0) -> subprocess.CompletedProcess:
    """Run a training job to its end; check its exit status unless expect is None."""
    proc = subprocess.run(train_cmd(run_dir, data, list(overrides), nproc), cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout)
    if expect is not None and proc.returncode != expect:
        raise AssertionError(f"exit {proc.returncode} (expected {expect})\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def start(run_dir: Path, data: Path, *overrides: str, nproc: int = 1) -> subprocess.Popen:
    """Start a training job in its own process group (so a signal reaches every rank)."""
    return subprocess.Popen(train_cmd(run_dir, data, list(overrides), nproc), cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> int:
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


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal the launcher and every process below it. torchrun starts each rank in a session of its
    own, so signalling the launcher's process group alone would leave the ranks running."""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    targets = tree if sig == signal.SIGKILL else [root]  # a SIGTERM to torchrun is forwarded by torchrun itself
    for p in targets:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    if sig == signal.SIGKILL:
        psutil.wait_procs(targets, timeout=30)


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

"""Checkpoints: model + optimizer through the engine (DCP, or DeepSpeed's own), plus the training state.

Layout: RUN/checkpoints/step_00000100/{state/, train_state.json, rng_rank{r}.pt}, written into a hidden
`.tmp_*` directory and renamed when complete; `RUN/checkpoints/latest` names the newest one and is updated
last, so a crash at any point leaves the previous checkpoint usable. The last `keep` are kept.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from rrtrain import dist
from rrtrain.dist import DistInfo
from rrtrain.errors import UsageError
from rrtrain.io import atomic_write_json, atomic_write_text


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class CheckpointManager:
    def __init__(self, run_dir: Path, keep: int, info: DistInfo) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep, self.info = keep, info

    def latest(self) -> Optional[Path]:
        marker = self.root / "latest"
        if not marker.exists():
            return None
        path = self.root / marker.read_text().strip()
        return path if (path / "train_state.json").exists() else None

    def save(self, engine, step: int, train_state: dict) -> Path:
        """Collective. Returns the final checkpoint directory."""
        name = f"step_{step:08d}"
        tmp, final = self.root / f".tmp_{name}", self.root / name
        if self.info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        engine.save(tmp / "state")
        torch.save(rng_state(), tmp / f"rng_rank{self.info.rank}.pt")
        dist.barrier()
        if self.info.is_main:
            atomic_write_json(tmp / "train_state.json", train_state)
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
            atomic_write_text(self.root / "latest", name + "\n")
            self._prune()
        dist.barrier()
        return final

    def _prune(self) -> None:
        done = sorted(p for p in self.root.glob("step_*") if p.is_dir())
        for old in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp_*"):
            shutil.rmtree(stale, ignore_errors=True)

    @staticmethod
    def read_train_state(path: Path) -> dict:
        return json.loads((path / "train_state.json").read_text())

    def load(self, engine, path: Path) -> None:
        """Collective. Restores model, optimizer and this rank's RNG."""
        engine.load(path / "state")
        rng_file = path / f"rng_rank{self.info.rank}.pt"
        if rng_file.exists():
            set_rng_state(torch.load(rng_file, weights_only=False))


# ---------------------------------------------------------------------------------------------
# Which configuration changes a resume accepts

#: changes that never matter for the run's trajectory
FREE = {
    "run.name", "train.log_every", "train.eval_every", "train.ckpt_every", "train.keep_ckpts", "train.diag_every",
    "train.allow_config_change", "train.fail_at_step", "train.fail_steps", "parallel.ac", "parallel.ac_every", "parallel.timeout_s",
    "parallel.reshard_after_forward", "train.compile", "data.num_workers", "data.cache_dir", "run.dir",
    "run.lock_wait_s",
}
#: changes that make resuming impossible whatever the user says (the saved state cannot be loaded)
NEVER_PREFIXES = ("model.", "match.")
NEVER = {"data.path", "train.seed", "parallel.backend"}


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, full + "."))
        else:
            out[full] = value
    return out


def check_resume(saved: dict, current: dict, saved_world: int, world: int, allow: bool) -> list[str]:
    """Compare the checkpoint's config with the current one; raise UsageError listing refused differences.

    Returns the differences that were accepted (to be logged)."""
    old, new = flatten(saved), flatten(current)
    diffs = [(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if saved_world != world:
        diffs.append(("world_size", saved_world, world))
    relevant = [d for d in diffs if d[0] not in FREE]
    fatal = [d for d in relevant if d[0] in NEVER or d[0].startswith(NEVER_PREFIXES)]
    text = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in (fatal or relevant))
    if fatal:
        raise UsageError(f"cannot resume: the checkpoint was written with a different configuration ({text}); "
                         "use a new run.dir")
    if relevant and not allow:
        raise UsageError(f"refusing to resume with a changed configuration ({text}); "
                         "set train.allow_config_change=true to resume anyway")
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in relevant]

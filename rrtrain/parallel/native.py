"""What the two PyTorch-native backends (`none`, `fsdp`) share: torch's fused AdamW stepped by the engine, and
checkpoints through torch.distributed.checkpoint (DCP), which reads and writes a plain module and an FSDP2 one
alike; DCP's pickled parts are read back through rrtrain/parallel/safe_load.py. The backends themselves: rrtrain/parallel/local.py and fsdp.py.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future
from pathlib import Path

import torch

from rrtrain.config import Config
from rrtrain.core.errors import RunError, UsageError
from rrtrain.model.transformer import Transformer
from rrtrain.parallel.adamw import build_optimizer, check_decay_groups, set_lr
from rrtrain.parallel.engine import Engine

# DCP warns on every save/load in a single process that it "assumes the intent is to save in a single process":
# it is, and the warning would bury real messages.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


class NativeEngine(Engine):
    """A model already prepared, wrapped and placed on `device` by the backend, with its optimizer built here."""

    def __init__(self, model: Transformer, cfg: Config, device: torch.device) -> None:
        self.inner = self.model = model  # fully_shard wraps in place: the sharded model is the same object
        self.device = device
        self.optimizer = build_optimizer(model, cfg.train, fused=True)  # fused on CPU too: see step_unless

    def backward(self, loss: torch.Tensor, last_micro: bool) -> None:
        loss.backward()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return norm.detach().float()

    def step(self, lr: float) -> None:
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.after_step()
        self.optimizer.zero_grad(set_to_none=True)

    def skip(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step_unless(self, lr: float, nonfinite: torch.Tensor) -> None:
        """Decided on the device: the fused AdamW kernel returns without touching parameters or moments where
        `found_inf` is 1, and torch takes its step count back (the mechanism GradScaler uses)."""
        set_lr(self.optimizer, lr)
        self.optimizer.found_inf = nonfinite
        try:
            self.optimizer.step()
        finally:
            self.optimizer.found_inf = None
        self.after_step(nonfinite)
        self.optimizer.zero_grad(set_to_none=True)

    def _state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.optimizer)
        return {"model": msd, "optim": osd}

    def save(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=str(path))

    def save_async(self, path: Path, process_group) -> Future:  # noqa: ANN001 - a ProcessGroup or None
        import torch.distributed.checkpoint as dcp

        # The default stager deep-copies every tensor into fresh CPU storage, CPU tensors too: the optimizer
        # steps that follow cannot change what is being written.
        return dcp.async_save(self._state(), checkpoint_id=str(path), process_group=process_group)

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """torch's own consolidation: the full state dict gathered from the FSDP2 shards (a plain module's is its
        own), offloaded to the CPU, on rank 0 (torch hands the other ranks an empty dict)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().to("cpu", torch.float32).clone() for k, v in state.items()}

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=True))

    def load(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from rrtrain.parallel.safe_load import RestrictedFileSystemReader, WeightsOnlyLoadPlanner, read_metadata

        read_metadata(path)  # every rank, before any collective: a refused file ends all ranks alike, in one line
        state = self._state()
        groups = [set(g["params"]) for g in state["optim"]["param_groups"]]  # dcp.load puts the saved ones here
        try:
            dcp.load(state, storage_reader=RestrictedFileSystemReader(path), planner=WeightsOnlyLoadPlanner())
        except CheckpointException as err:  # a rank's refusal (safe_load.refused, .damaged), wrapped by DCP's collectives
            refusal = next((f for f in _failures(err) if isinstance(f, (UsageError, RunError))), None)
            if refusal is not None:
                raise refusal from None
            raise
        check_decay_groups([set(g["params"]) for g in state["optim"]["param_groups"]], groups, path.parent.name)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _failures(err: BaseException) -> list[BaseException]:
    """The per-rank errors inside DCP's CheckpointException."""
    out = []
    for f in (getattr(err, "failures", None) or {}).values():
        f = f[0] if isinstance(f, tuple) and f else f
        if isinstance(f, BaseException):
            out.append(f)
    return out

"""DeepSpeed ZeRO (stage 1, 2 or 3) behind the same `Engine` interface as the PyTorch backends.

A meta-built model (training's path) is first given its weights: at stage 3 it is rebuilt under `zero.Init`
(partitioned module by module) and initialised unit by unit (`build_partitioned`); stages 1-2 keep a whole copy
per rank by design, so it is materialised whole (rrtrain/parallel/materialize.py). Then, as everywhere
(rrtrain/parallel/prepare.py): activation checkpointing -> optional torch.compile of each block; then
`deepspeed.initialize`.
DeepSpeed owns the optimizer step, so this engine maps the loop's calls onto it:

- `backward(loss / accum, last_micro)`: the loop has already divided by `accum`, so DeepSpeed must not
  (`scale_wrt_gas=False`); the accumulation boundary is set explicitly from `last_micro`, and
  `engine.step()` runs after every other micro-batch, so DeepSpeed's micro-step counter counts micro-batches
  exactly as it does in DeepSpeed's own loop.
- `clip_grad_norm(max_norm)`: the global L2 norm of the reduced gradients, computed by the ZeRO optimizer's
  own norm routine before the step (identical on every rank); DeepSpeed clips inside `step()` with
  `gradient_clipping = max_norm`, using the same formula as `torch.nn.utils.clip_grad_norm_`.
- `step(lr)`: sets the learning rate on our AdamW's parameter groups (weight decay on matrices only,
  `rrtrain.parallel.adamw.param_groups`) and calls `engine.step()`.
- `skip()`: DeepSpeed's step runs with the AdamW update turned into a no-op, so the reduced gradients are
  freed the usual way and no moment, step count or weight changes; `global_steps` advances with the
  trainer's step and `skipped_steps` counts the skip (DeepSpeed takes its own overflow path, which does the
  same, when the gradients themselves are non-finite).
- `step_unless(lr, nonfinite)`: the Engine default, which reads the flag on the host. A device-side skip
  would remove no sync here: every ZeRO optimizer's own `step()` branches in Python on whether the
  gradient norm is finite (`is_invalid_grad_norm` is `bool()` of a device tensor: ZeRO-1/2
  `DeepSpeedZeroOptimizer.step`, ZeRO-3 `DeepSpeedZeroOptimizer_Stage3.step`, `BF16_Optimizer.step`), so
  the host waits for the device once per step inside DeepSpeed whatever rrtrain does, at the same point.
- `save(path)` / `load(path)`: DeepSpeed's `save_checkpoint` / `load_checkpoint` under `path` with a fixed
  tag and no `latest` file (rrtrain's own `latest` marker lives one level up). DeepSpeed's own checkpoint
  engine reads `*_model_states.pt` and `*_optim_states.pt` with `torch.load(weights_only=False)` and offers no
  switch, so for the load it is swapped for one whose `load` is `torch.load(weights_only=True)` with exactly
  the three DeepSpeed classes those files hold admitted (rrtrain/parallel/safe_load.py): a file that names
  anything else is refused unread. Before that, rrtrain's manifest has checked every file's length and xxh64
  (rrtrain/training/checkpoint.py, docs/reliability.md).

On a machine without CUDA, `DS_ACCELERATOR=cpu` is set before DeepSpeed is imported; torch.distributed is
already up (gloo on CPU, NCCL on CUDA; `rrtrain.core.dist.setup`) and DeepSpeed reuses that process group.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rrtrain.config import Config
from rrtrain.core.dist import DistInfo
from rrtrain.core.errors import UsageError
from rrtrain.model.transformer import Transformer, build_model
from rrtrain.parallel.adamw import build_optimizer, check_decay_groups, group_names, set_lr
from rrtrain.parallel.engine import Engine
from rrtrain.parallel.materialize import initialise_units, is_meta, place
from rrtrain.parallel.prepare import prepare_blocks

#: the tag of every DeepSpeed checkpoint, inside the directory the checkpoint manager hands over
TAG = "zero"


class _QuietUntestedOptimizer(logging.Filter):
    """Our optimizer is torch's AdamW with a discard switch; DeepSpeed's "untested optimizer" warning is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "untested optimizer" not in record.getMessage()


def import_deepspeed() -> Any:
    """`import deepspeed`, on the CPU accelerator when there is no CUDA device, with its INFO logs muted."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    if not any(isinstance(f, _QuietUntestedOptimizer) for f in ds_logger.filters):
        ds_logger.addFilter(_QuietUntestedOptimizer())
    if deepspeed.get_accelerator().device_name() == "cpu":
        # DeepSpeed's CPU communication backend JIT-compiles a shared-memory all-reduce kernel (minutes on a
        # fresh machine, and it needs a C++ toolchain) that only its inference all-reduce uses; ZeRO training
        # goes through torch.distributed (gloo), so skip the build.
        import deepspeed.comm.torch  # noqa: F401  (`deepspeed.comm.torch` as an attribute is torch itself)

        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    return deepspeed


def ensure_process_group(info: DistInfo) -> None:
    """DeepSpeed needs torch.distributed even in one process: start a one-rank group when torchrun did not."""
    import torch.distributed as dist

    os.environ.setdefault("LOCAL_RANK", str(info.local_rank))  # DeepSpeed asserts that a launcher set it
    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=info.device if info.device.type == "cuda" else None)


class _DiscardableAdamW(torch.optim.AdamW):
    """torch AdamW whose update can be switched off for one DeepSpeed step (see `DeepSpeedEngine.skip`)."""

    discard = False

    def step(self, closure=None):  # type: ignore[override]
        if self.discard:
            return None
        return super().step(closure)


def ds_config(cfg: Config, world_size: int, cuda: bool) -> dict[str, Any]:
    """The DeepSpeed configuration a run's config implies; the global batch stays `train.global_batch`."""
    t, p = cfg.train, cfg.parallel
    per_step = t.micro_batch * world_size
    if t.global_batch % per_step:
        raise UsageError(f"train.global_batch={t.global_batch} is not a multiple of train.micro_batch "
                         f"({t.micro_batch}) x world size ({world_size})")
    bf16 = p.precision == "bf16"
    zero: dict[str, Any] = {
        "stage": p.zero_stage,
        "overlap_comm": cuda,  # reduce on a side stream during backward; CPU/gloo has no streams to overlap
        "contiguous_gradients": True,
        "reduce_scatter": True,
    }
    if p.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = False  # the sharded checkpoint is enough
    return {
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.global_batch // per_step,
        "train_batch_size": t.global_batch,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        # bf16: fp32 master weights (ZeRO keeps them), fp32 gradient reductions and accumulation, as with FSDP2
        "communication_data_type": "fp32",
        "data_types": {"grad_accum_dtype": "fp32"} if bf16 else {},
        "zero_allow_untested_optimizer": True,  # _DiscardableAdamW is torch's AdamW
        "steps_per_print": 2**62,  # rrtrain logs; DeepSpeed stays quiet
        "wall_clock_breakdown": False,
    }


def build_partitioned(deepspeed: Any, meta: Transformer, cfg: Config, config: dict[str, Any],
                      device: torch.device) -> Transformer:
    """ZeRO-3 without a whole model per rank: `meta`'s model rebuilt under `zero.Init`, which partitions each
    module's parameters as soon as it is constructed, then initialised one unit at a time (the unit gathered,
    written with the values every rank drew identically from the unit's generator, re-partitioned): the same
    bits as every other backend (rrtrain/parallel/materialize.py)."""
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend=dist.get_backend(), verbose=False)  # zero.Init asks deepspeed.comm
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = build_model(meta.spec, device=device, seed=None)

    def write(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        params = [target for target, _ in pairs if hasattr(target, "ds_id")]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0), torch.no_grad():
            for target, full in pairs:
                target.data.copy_(full)

    initialise_units(model, cfg.train.seed, write)
    return model


class DeepSpeedEngine(Engine):
    """DeepSpeed ZeRO stage `parallel.zero_stage` (1: optimizer state, 2: + gradients, 3: + parameters)."""

    sharded = True

    def __init__(self, model: Transformer, cfg: Config, info: DistInfo) -> None:
        deepspeed = import_deepspeed()
        self.device, self.stage = info.device, cfg.parallel.zero_stage
        t = cfg.train
        ensure_process_group(info)
        import torch.distributed as dist

        self.config = ds_config(cfg, dist.get_world_size(), cuda=info.device.type == "cuda")
        if self.stage == 3 and is_meta(model):
            model = build_partitioned(deepspeed, model, cfg, self.config, info.device)
        else:  # stages 0-2 keep a whole copy of the parameters on every rank, by design
            place(model, info.device, t.seed)
        self.inner = model
        prepare_blocks(model, cfg)
        self.base_opt = build_optimizer(model, t, fused=info.device.type == "cuda", cls=_DiscardableAdamW)
        self.decay_groups = group_names(model, t.weight_decay)  # what a checkpoint's groups must match
        self.model, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=self.base_opt,
                                                                config=self.config, dist_init_required=False)
        self.ds = self.model

    # -- one optimizer step -------------------------------------------------------------------

    def backward(self, loss: torch.Tensor, last_micro: bool) -> None:
        self.ds.set_gradient_accumulation_boundary(last_micro)
        self.ds.backward(loss, scale_wrt_gas=False)  # the loop already divided by accum
        if not last_micro:
            self.ds.step()  # not a boundary: only advances DeepSpeed's micro-step counter

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The global pre-clip norm of the reduced gradients; DeepSpeed clips to `max_norm` inside step()."""
        opt = self.ds.optimizer
        opt.clip_grad = max_norm if max_norm > 0 else 0.0
        if hasattr(opt, "scaled_global_norm"):  # ZeRO-1/2 (DeepSpeedZeroOptimizer)
            norm = opt.scaled_global_norm()
        elif hasattr(opt, "_get_norm_groups"):  # ZeRO-3 (DeepSpeedZeroOptimizer_Stage3)
            from deepspeed.runtime.utils import combine_grad_norm_groups

            norm = combine_grad_norm_groups(opt._get_norm_groups())
        else:  # ZeRO-1 with bf16 weights and fp32 gradient accumulation runs on DeepSpeed's BF16_Optimizer
            from deepspeed.runtime.utils import get_global_norm_of_tensors

            grads, _ = opt.get_grads_for_norm()
            norm = get_global_norm_of_tensors(grads, mpu=opt.mpu, norm_type=2)
        norm = torch.as_tensor(norm).detach().float().reshape(())
        # DeepSpeed's norm helpers report a non-finite norm as -1 (or +inf); the loop wants a non-finite value
        invalid = ~torch.isfinite(norm) | (norm < 0)
        return torch.where(invalid, torch.full_like(norm, math.nan), norm / getattr(opt, "loss_scale", 1.0))

    def step(self, lr: float) -> None:
        set_lr(self.base_opt, lr)
        self.ds.step()
        self.after_step()

    def after_step(self, nonfinite: torch.Tensor | None = None) -> None:
        """The rule's hook (`Engine.after_step`) on what DeepSpeed keeps: each parameter's fp32 master gathered
        whole (a collective, every rank, every parameter, in order), fn applied, then set as `load_model_state`
        sets it. Only after a step that updated the weights (`step`; `step_unless` reads the flag on the host)."""
        from deepspeed.utils import safe_get_full_fp32_param

        hook = getattr(self.inner.rule, "after_step", None)
        if hook is None or (nonfinite is not None and bool(nonfinite.item())):
            return
        for p, fn in hook(self.inner):
            full = safe_get_full_fp32_param(p)
            self._set_full(p, fn((p.detach() if full is None else full).to(self.device, torch.float32)))

    def skip(self) -> None:
        before = self.ds.skipped_steps
        self.base_opt.discard = True
        try:
            self.ds.step()  # frees the reduced gradients, advances global_steps; AdamW does nothing
        finally:
            self.base_opt.discard = False
        if self.ds.skipped_steps == before:  # DeepSpeed did not see an overflow itself
            self.ds.skipped_steps += 1

    def grad_sq_norms(self, groups: list[list[nn.Parameter]]) -> torch.Tensor:
        """Per-group squared norms of the reduced gradients, from DeepSpeed's `safe_get_full_grad`
        (a collective: every rank calls it for every parameter; diagnostics only)."""
        from deepspeed.utils import safe_get_full_grad

        out = []
        for params in groups:
            total = torch.zeros((), dtype=torch.float32)
            for p in params:
                g = safe_get_full_grad(p)
                if g is not None:
                    total += g.detach().float().pow(2).sum().cpu()
            out.append(total)
        return torch.stack(out).to(self.device) if out else torch.zeros(0, device=self.device)

    # -- checkpoints --------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        self.ds.save_checkpoint(str(path), tag=TAG, save_latest=False)

    def load(self, path: Path) -> None:
        import torch.distributed as dist

        written = len(list((Path(path) / TAG).glob("zero_pp_rank_*_mp_rank_00_optim_states.pt")))
        if written and written != dist.get_world_size():
            raise UsageError(f"cannot resume: the DeepSpeed checkpoint {path.parent.name} was written by {written} "
                             f"ranks and this run has {dist.get_world_size()}; DeepSpeed ZeRO checkpoints load only "
                             "at the world size that wrote them (use that world size, or a new run.dir)")
        from rrtrain.parallel.safe_load import check_tree, weights_only_deepspeed_engine

        check_tree(Path(path))  # DeepSpeed opens its files by path itself: every one a regular file, no link
        saved = saved_groups(Path(path) / TAG / "mp_rank_00_model_states.pt")
        if saved is not None:
            check_decay_groups(saved, self.decay_groups, Path(path).parent.name)
        saving = self.ds.checkpoint_engine
        self.ds.checkpoint_engine = weights_only_deepspeed_engine(saving)  # every file it reads: weights-only
        try:
            loaded, _ = self.ds.load_checkpoint(str(path), tag=TAG, load_optimizer_states=True,
                                                load_lr_scheduler_states=False)
        finally:
            self.ds.checkpoint_engine = saving
        if loaded is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint under {path / TAG}")

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """DeepSpeed's own consolidation, in memory: each parameter's fp32 master (`safe_get_full_fp32_param`:
        gathered from the ZeRO partitions, a collective every rank calls for every parameter in the same order),
        the persistent buffers as the module holds them. Whole on every rank."""
        from deepspeed.utils import safe_get_full_fp32_param

        out: dict[str, torch.Tensor] = {}
        for name, p in self.inner.named_parameters():
            full = safe_get_full_fp32_param(p)
            if full is None:  # no fp32 master mapped to it (fp32 training at stages 1-2): the module's own copy
                full = p.detach()
            out[name] = full.detach().to("cpu", torch.float32).clone()
        params = dict(self.inner.named_parameters())
        for name, value in self.inner.state_dict().items():
            if name not in params and name not in out:
                out[name] = value.detach().to("cpu").clone()
        return out

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Each parameter's fp32 master (DeepSpeed's `safe_set_full_fp32_param`) and its working copy in the module
        (gathered at stage 3, rank 0 writing) set from `state`; buffers copied in place."""
        for name, p in self.inner.named_parameters():
            self._set_full(p, state[name].to(self.device, torch.float32))
        params = dict(self.inner.named_parameters())
        with torch.no_grad():
            for name, buf in self.inner.named_buffers():
                if name not in params and name in state:
                    buf.copy_(state[name].to(buf.device, buf.dtype))

    def _set_full(self, p: nn.Parameter, full: torch.Tensor) -> None:
        """Collective: a parameter's fp32 master (DeepSpeed's `safe_set_full_fp32_param`) and its working copy in the
        module (gathered at stage 3, rank 0 writing) set to `full`, the whole fp32 value, the same on every rank."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_local_fp32_param

        if hasattr(p, "ds_id") and p.requires_grad:  # ZeRO-3: this rank's slice of the master
            # Not `safe_set_full_fp32_param`: it slices the whole value without the padding of the last partitions,
            # so a parameter of fewer elements than ranks (rezero's alpha, ngpt's scalars) raised on the last rank.
            size = p.ds_tensor.numel()
            rank = p._z3_optimizer._get_param_partition_rank(p)
            flat = torch.nn.functional.pad(full.flatten(), (0, max(0, size * (rank + 1) - full.numel())))
            safe_set_local_fp32_param(p, flat.narrow(0, size * rank, size))
        else:
            safe_set_full_fp32_param(p, full)
        if hasattr(p, "ds_id"):  # ZeRO-3: partitioned
            with import_deepspeed().zero.GatheredParameters([p], modifier_rank=0), torch.no_grad():
                p.data.copy_(full.to(p.dtype))
        else:
            with torch.no_grad():
                p.data.copy_(full.to(p.dtype))

    # -- bookkeeping --------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        """DeepSpeed's own step counters (tests check that skip() keeps them in line with the loop)."""
        return {"global_steps": int(self.ds.global_steps), "skipped_steps": int(self.ds.skipped_steps),
                "micro_steps": int(self.ds.micro_steps)}

    def local_state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds: the module's parameters (their ZeRO-3 partitions at stage 3) and the optimizer
        state (fp32 master partitions + AdamW moments)."""

        def nbytes(t: torch.Tensor) -> int:
            return t.numel() * t.element_size()

        params = sum(nbytes(p.ds_tensor if hasattr(p, "ds_tensor") else p) for p in self.inner.parameters())
        # master partitions: the optimizer's parameters (ZeRO-1/2) or its state's keys (ZeRO-3 swaps its flat
        # sub-groups in and out of param_groups around each step)
        masters = {id(p): p for group in self.base_opt.param_groups for p in group["params"]}
        masters.update({id(p): p for p in self.base_opt.state})
        optim = sum(nbytes(p) for p in masters.values())
        for state in self.base_opt.state.values():
            optim += sum(nbytes(v) for v in state.values() if torch.is_tensor(v))
        return {"param_bytes": int(params), "optim_bytes": int(optim)}


def saved_groups(model_states: Path) -> list[set[str]] | None:
    """The parameter names of each optimizer group a DeepSpeed checkpoint was written with (its `param_shapes`),
    read weights-only and memory-mapped (the weights beside them are not read); None when it records none."""
    import pickle

    from rrtrain.core import files
    from rrtrain.parallel.safe_load import DAMAGE, damaged, deepspeed_globals, refused

    if not model_states.is_file():
        return None  # DeepSpeed's own load says what is missing
    try:
        files.open_regular(model_states).close()  # memory-mapped by path: a regular file, not a link
        with torch.serialization.safe_globals(deepspeed_globals()):
            state = torch.load(model_states, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        raise refused(model_states, err) from None
    except (OSError, *DAMAGE) as err:
        raise damaged(model_states, err) from None
    shapes = state.get("param_shapes") if isinstance(state, dict) else None
    if not isinstance(shapes, list) or not all(isinstance(g, dict) for g in shapes):
        return None
    return [{str(n) for n in g} for g in shapes]

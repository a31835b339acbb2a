"""Memory per GPU and time for a training run, before spending it: the model behind `rrtrain plan` and
`train.micro_batch: auto` (`auto_batch.py`), beside the engines whose holdings it predicts.

Nothing here allocates the model. Parameter counts and FLOPs come from `rrtrain.sizing`. Per-rank
shard sizes come from each parameter's shape (the real model built on the meta device, so no
memory) and FSDP2's rule: dim 0 is split like `torch.chunk(world)`, and rank 0 holds the largest piece.
Activations come from tracing the real model, also on fake tensors, at the run's sequence length with
one and two blocks: the bytes autograd saves for backward, split into a per-block and a fixed part
(embeddings, readout, LM head and loss). Activations scale exactly with the micro-batch, so one trace
per shape, variant and dtype serves every micro-batch.

What is held per rank, as the trainer does it (`rrtrain/parallel/fsdp.py`, `deepspeed.py`):

* FSDP2, bf16: fp32 master parameters, fp32 gradients and AdamW's two fp32 moments, all sharded
  over `dp_shard` ranks; bf16 compute copies of the unit in use (the root, which FSDP keeps gathered
  through forward and backward, plus the current and the prefetched block), and in backward that block's
  gradient and its fp32 reduce-scatter input. With gradient accumulation the trainer skips the
  reduce-scatter on all but the last micro-batch, so FSDP keeps every unsharded gradient, in fp32.
* One process: everything fp32 and whole; bf16 autocast caches one bf16 copy of each weight.
* DeepSpeed ZeRO-1/2/3: bf16 working parameters (sharded at stage 3), fp32 gradient accumulation
  (sharded from stage 2), fp32 master parameters and moments sharded. These figures are DeepSpeed's
  documented layout, not checked by simulation.

Time is tokens x FLOPs per token / (GPUs x peak x MFU); MFU counts model FLOPs (6N + 12LTD), so
recomputing checkpointed blocks costs extra time: a fraction f of blocks recomputed adds 2N/6N x f.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from rrtrain.config import DEFAULT_GPU, DEFAULT_MFU, ZERO_STAGES, Config, ModelConfig, ParallelConfig, choices
from rrtrain.core.errors import UsageError
from rrtrain.core.hardware import GPU_MEMORY_GIB, GPU_PEAK_TFLOPS, precision_key
from rrtrain import sizing
from rrtrain.residuals import RuleSpec
from rrtrain.resolve import ResolvedRun
from rrtrain.resolve import resolve as resolve_run

#: the share of a GPU's memory the plan leaves free for the CUDA context, NCCL buffers and fragmentation
HEADROOM = 0.10
BACKENDS = choices(ParallelConfig, "backend")
AC_MODES = ("none", "selective", "full")  # parallel.ac's values, least recomputation first (`recommended`)
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
PRECISIONS = choices(ParallelConfig, "precision")
#: the keys of the run's parallel section, which a Setup holds as they are (read through: `setup.backend`)
PARALLEL_KEYS = frozenset(f.name for f in dataclasses.fields(ParallelConfig))
#: where a plan's parallel defaults differ from a run's: a plan is of a GPU job (FSDP, bf16), a run's defaults
#: are one process in fp32
PLAN_PARALLEL = {"backend": "fsdp", "precision": "bf16"}


@dataclass(frozen=True, init=False)
class Setup:
    """One run to plan: the run's model and parallel sections as the trainer reads them, its batch, the hardware.

    The parallel keys read through (`setup.backend`, `setup.ac`, ...) and may be given as keywords, each over
    `parallel` (or over a plan's defaults: `PLAN_PARALLEL`): `Setup(model, gpus=8, ac="full")`.
    `Setup.of_run` lays out a resolved run as the trainer will.
    """

    model: ModelConfig
    gpus: int
    parallel: ParallelConfig  # backend, dp_shard (None: all GPUs), zero_stage, ac, ac_every, precision, ...
    micro_batch: int = 1
    global_batch: Optional[int] = None  # None: micro_batch x GPUs (no accumulation)
    tokens: Optional[float] = None  # the budget to price (None: memory only)
    gpu: str = DEFAULT_GPU
    mfu: float = DEFAULT_MFU
    run: Optional[ResolvedRun] = None  # the resolved run when known (a sweep's: matched shape, the dataset's
    # vocabulary); else `model` is resolved alone (the preset's shape)

    def __init__(self, model: ModelConfig, gpus: int, *, parallel: Optional[ParallelConfig] = None,
                 micro_batch: int = 1, global_batch: Optional[int] = None, tokens: Optional[float] = None,
                 gpu: str = DEFAULT_GPU, mfu: float = DEFAULT_MFU, run: Optional[ResolvedRun] = None,
                 **parallel_keys: Any) -> None:
        unknown = sorted(set(parallel_keys) - PARALLEL_KEYS)
        if unknown:
            raise TypeError(f"Setup got an unexpected keyword argument '{unknown[0]}'")
        base = parallel if parallel is not None else ParallelConfig(**PLAN_PARALLEL)
        values = {"model": model, "gpus": gpus, "parallel": dataclasses.replace(base, **parallel_keys),
                  "micro_batch": micro_batch, "global_batch": global_batch, "tokens": tokens, "gpu": gpu,
                  "mfu": mfu, "run": run}
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def of_run(cls, run: ResolvedRun, gpus: int, *, micro_batch: int, backend: Optional[str] = None,
               **plan_keys: Any) -> "Setup":
        """A resolved run on `gpus` GPUs as the trainer lays it out: its model, its parallel section with the
        FSDP mesh it will build (`dp_shard`), its global batch; `backend` over the run's own."""
        from rrtrain.parallel.mesh import mesh_shape

        par = run.cfg.parallel
        backend = backend or par.backend
        dp_shard = mesh_shape(par, gpus)[1] if backend == "fsdp" else None
        return cls(run.cfg.model, gpus, parallel=dataclasses.replace(par, backend=backend, dp_shard=dp_shard),
                   micro_batch=micro_batch, global_batch=run.cfg.train.global_batch, run=run, **plan_keys)

    def __getattr__(self, name: str) -> Any:  # only for names not found: the parallel section's keys
        if name in PARALLEL_KEYS:
            return getattr(self.parallel, name)
        raise AttributeError(f"'Setup' object has no attribute '{name}'")

    @property
    def shard(self) -> int:
        return self.dp_shard if self.dp_shard is not None else self.gpus

    @property
    def batch(self) -> int:
        return self.global_batch if self.global_batch is not None else self.micro_batch * self.gpus

    @property
    def accum(self) -> int:
        return self.batch // (self.micro_batch * self.gpus)


def check(s: Setup) -> None:
    """Raise a one-line UsageError for a setup that cannot run (named by `rrtrain plan`'s flags; the allowed
    values are the config's own)."""
    if s.gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {s.gpus}")
    if s.backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got '{s.backend}'")
    if s.backend == "none" and s.gpus > 1:
        raise UsageError(f"--backend none runs one process; use fsdp or deepspeed for {s.gpus} GPUs")
    if s.ac not in AC_MODES:
        raise UsageError(f"--ac must be one of {', '.join(AC_MODES)}, got '{s.ac}'")
    if s.ac_every < 1:
        raise UsageError(f"--ac-every must be at least 1, got {s.ac_every}")
    if s.zero_stage not in ZERO_STAGES:
        raise UsageError(f"--zero-stage must be 1, 2 or 3, got {s.zero_stage}")
    if s.precision not in PRECISIONS:
        raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}, got '{s.precision}'")
    if s.micro_batch < 1:
        raise UsageError(f"--micro-batch must be at least 1, got {s.micro_batch}")
    if not 0.0 < s.mfu <= 1.0:
        raise UsageError(f"--mfu must be in (0, 1], got {s.mfu}")
    if s.tokens is not None and s.tokens <= 0:
        raise UsageError(f"--tokens must be positive, got {s.tokens:g}")
    if s.shard < 1 or s.gpus % s.shard:
        raise UsageError(f"--dp-shard={s.shard} must divide --gpus={s.gpus}")
    if s.backend != "fsdp" and s.dp_shard not in (None, s.gpus):
        raise UsageError("--dp-shard applies to --backend fsdp only")
    if s.batch % (s.micro_batch * s.gpus):
        raise UsageError(f"--global-batch={s.batch} is not a multiple of --micro-batch ({s.micro_batch}) "
                         f"x --gpus ({s.gpus})")
    gpu_spec(s.gpu)


def gpu_spec(name: str, precision: str = "bf16") -> tuple[float, int]:
    """(dense peak FLOP/s of the run's matmul precision, memory bytes) of a GPU named case-insensitively, e.g. h100."""
    key = name.upper()
    if key not in GPU_MEMORY_GIB:
        known = ", ".join(k.lower() for k in GPU_MEMORY_GIB)
        raise UsageError(f"--gpu: unknown GPU '{name}'; known: {known}")
    return GPU_PEAK_TFLOPS[key][precision_key(precision)] * 1e12, int(GPU_MEMORY_GIB[key] * 2**30)


def storage(precision: str) -> str:
    """The dtype of a precision's parameters and activations: fp32_tf32 stores fp32 (only its matmuls differ)."""
    return "bf16" if precision == "bf16" else "fp32"


# ---------------------------------------------------------------------------------------------
# Parameter layout: every tensor's shape and FSDP unit, from the real model on fake tensors


@dataclass(frozen=True)
class Layout:
    """The model's parameters: (shape, FSDP unit) per tensor; unit -1 is the root (all but the blocks)."""

    tensors: tuple[tuple[tuple[int, ...], int], ...]

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) for shape, _ in self.tensors)

    def unit_numel(self, unit: int) -> int:
        return sum(math.prod(shape) for shape, u in self.tensors if u == unit)

    def block_numel(self) -> int:
        """The largest block's parameter count (blocks differ only for depth-dependent rules)."""
        return max((self.unit_numel(u) for u in {u for _, u in self.tensors if u >= 0}), default=0)

    def shard_numel(self, world: int, rank: int = 0) -> int:
        """Elements rank `rank` holds when every tensor is sharded on dim 0 over `world` ranks."""
        return sum(shard_numel(shape, world, rank) for shape, _ in self.tensors)


def shard_numel(shape: tuple[int, ...], world: int, rank: int = 0) -> int:
    """FSDP2's local shard of one tensor: dim 0 in pieces of ceil(dim0 / world), like torch.chunk."""
    if not shape:
        return 1 if rank == 0 else 0  # FSDP2 shards scalars as one-element tensors on the first rank
    rows = -(-shape[0] // world)
    mine = max(0, min(rows, shape[0] - rank * rows))
    return mine * math.prod(shape[1:])


@contextlib.contextmanager
def _fake(dtype: torch.dtype):
    """Fake tensors (no memory, no compute) created in `dtype`; the real kernels' shape rules apply."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with FakeTensorMode():
            yield
    finally:
        torch.set_default_dtype(old)


def _build(m: ModelConfig, shape: sizing.ModelShape, rule: Optional[RuleSpec], device: str = "cpu"):
    """The model's modules, uninitialised: only shapes and storages are read here, and on fake (or meta) tensors
    initialising them would compute nothing but cost the most of a build."""
    from rrtrain.resolve import build_model

    if m.doc_mask and m.eod_id is None:  # no dataset yet: the mask's memory is the same wherever documents end
        m = dataclasses.replace(m, eod_id=0)
    return build_model(m, shape=shape, device=device, rule=rule, seed=None)


_CACHE: dict[tuple, object] = {}


def _cached(kind: str, m: ModelConfig, *key, make):
    """Memoise per (model config, ...): ModelConfig is a mutable dataclass, so key on its repr."""
    full = (kind, repr(m), *key)
    if full not in _CACHE:
        _CACHE[full] = make()
    return _CACHE[full]


def layout(m: ModelConfig, shape: sizing.ModelShape, rule: Optional[RuleSpec] = None) -> Layout:
    """`rule`: the resolved run's spec of `m.variant` (None: looked up by name)."""
    return _cached("layout", m, shape, make=lambda: _layout(m, shape, rule))


def _layout(m: ModelConfig, shape: sizing.ModelShape, rule: Optional[RuleSpec]) -> Layout:
    model = _build(m, shape, rule, device="meta")  # shapes alone: nothing allocated, nothing initialised
    unit_of = {id(p): i for i, b in enumerate(model.blocks) for p in b.parameters()}
    return Layout(tuple((tuple(p.shape), unit_of.get(id(p), -1)) for p in model.parameters()))


# ---------------------------------------------------------------------------------------------
# Activations: what autograd saves, traced on fake tensors


@dataclass(frozen=True)
class ActivationProfile:
    """Bytes saved for backward per sequence (micro-batch 1) at the run's sequence length."""

    fixed: int  # embeddings, stream expand/readout, LM head, loss
    per_block: int  # one block, nothing checkpointed
    block_input: int  # one block's input state: all a checkpointed block keeps
    loss_grad: int  # the loss's backward at its peak: two fp32 logits-sized gradients (+ the bf16 cast)

    def saved(self, n_layers: int, ac: str, ac_every: int) -> int:
        """Activations held at the end of forward, per sequence."""
        ckpt = checkpointed_blocks(n_layers, ac, ac_every)
        return self.fixed + (n_layers - ckpt) * self.per_block + ckpt * self.block_input


def checkpointed_blocks(n_layers: int, ac: str, ac_every: int) -> int:
    """How many blocks `rrtrain.parallel.ac.apply_ac` wraps."""
    if ac == "none":
        return 0
    if ac == "full":
        return n_layers
    return len(range(0, n_layers, ac_every))


class _Enough(Exception):
    """Raised to end a trace once the block inputs asked for are known (`_saved_bytes(..., inputs_only=True)`)."""


def _saved_bytes(m: ModelConfig, shape: sizing.ModelShape, autocast: bool, rule: Optional[RuleSpec],
                 inputs_only: bool = False) -> tuple[int, list[dict[int, int]]]:
    """(bytes saved for backward for one sequence, loss included; each block's input state as {storage: bytes}).
    `inputs_only`: the block inputs alone, the forward ended as the last block starts (the bytes then count
    only what was saved before it; what the trace did up to there is the same as in a whole one)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._pytree import tree_leaves

    model = _build(m, shape, rule)
    params = {StorageWeakRef(p.untyped_storage()).cdata for p in model.parameters()}
    saved: dict[int, int] = {}
    block_in: list[dict[int, int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = StorageWeakRef(storage).cdata
        if key not in params:
            saved[key] = storage.nbytes()
        return t

    def note_input(_module, args) -> None:
        tensors = tree_leaves(args[0])  # a tensor, or a (nested) tuple of them (DenseFormer's slots, MUDD's inputs)
        block_in.append({StorageWeakRef(t.untyped_storage()).cdata: t.untyped_storage().nbytes() for t in tensors})
        if inputs_only and len(block_in) == len(model.blocks):
            raise _Enough

    for block in model.blocks:
        block.register_forward_pre_hook(note_input)
    idx = torch.zeros(1, shape.seq_len, dtype=torch.long)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp, contextlib.suppress(_Enough):
        model(idx, idx)
    return sum(saved.values()), block_in


def activation_profile(m: ModelConfig, shape: sizing.ModelShape, compute: str, autocast: bool,
                       rule: Optional[RuleSpec] = None) -> ActivationProfile:
    """Trace the model, loss included, with one and with two blocks; the difference is one block."""
    return _cached("acts", m, shape, compute, autocast, make=lambda: _activation_profile(m, shape, compute, autocast, rule))


def _activation_profile(m: ModelConfig, shape: sizing.ModelShape, compute: str, autocast: bool,
                        rule: Optional[RuleSpec]) -> ActivationProfile:
    dtype = torch.bfloat16 if compute == "bf16" and not autocast else torch.float32
    with _fake(dtype):
        one, _ = _saved_bytes(m, dataclasses.replace(shape, n_layers=1), autocast, rule)
        two, _ = _saved_bytes(m, dataclasses.replace(shape, n_layers=2), autocast, rule)
        # What a checkpointed block adds: the storages of its input state that the block before it did not hold
        # (a new stream, DenseFormer's newest slot, MUDD's next inputs and newest slot; not value residual's V_1,
        # held once for every block). The third block: the first's input is a view of the embedding, the second's
        # may hold what the first made for all (V_1).
        _, inputs = _saved_bytes(m, dataclasses.replace(shape, n_layers=3), autocast, rule, inputs_only=True)
        block_in = sum(n for key, n in inputs[2].items() if key not in inputs[1])
    loss_grad = shape.seq_len * shape.vocab_size * (10 if compute == "bf16" else 8)
    return ActivationProfile(fixed=2 * one - two, per_block=two - one, block_input=block_in, loss_grad=loss_grad)


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class Item:
    """One line of the memory table: what, in which dtype, bytes per rank."""

    what: str
    dtype: str
    bytes: int


@dataclass(frozen=True)
class Plan:
    setup: Setup
    shape: sizing.ModelShape
    params: int
    state: tuple[Item, ...]  # parameters, gradients, optimizer state: held for the whole run
    transient: tuple[Item, ...]  # gathered compute copies and gradient buffers at the peak
    activations: dict[str, int] = field(default_factory=dict)  # per rank, by AC mode, at this micro-batch
    capacity: int = 0  # the GPU's memory
    comm_bytes: int = 0  # bytes each rank sends per optimizer step (ring collectives)
    flops_per_token: float = 0.0
    tokens_per_step: int = 0
    time_s: Optional[float] = None
    gpu_hours: Optional[float] = None
    warnings: tuple[str, ...] = ()

    @property
    def state_bytes(self) -> int:
        return sum(i.bytes for i in self.state)

    @property
    def transient_bytes(self) -> int:
        return sum(i.bytes for i in self.transient)

    def total(self, ac: Optional[str] = None) -> int:
        """Predicted peak per rank with the setup's AC mode (or `ac`).

        Gradients and activations are not held at full size together: backward frees a block's
        activations as it writes that block's gradients, and the step starts with no gradients
        (`zero_grad(set_to_none=True)`). The peak is at the start of backward (all activations and the
        loss's gradient) or at its end (all gradients), whichever is larger; the CPU check in
        tests/distributed/test_plan_measured.py agrees with this to a few percent.
        """
        grads = self.category("gradients")
        held = self.state_bytes - grads + self.transient_bytes
        return held + max(grads, self.activations[ac or self.setup.ac])

    @property
    def usable(self) -> int:
        return int(self.capacity * (1.0 - HEADROOM))

    @property
    def fits(self) -> bool:
        return self.total() <= self.usable

    def category(self, prefix: str) -> int:
        """Bytes of the state items whose name starts with `prefix` (parameters, gradients, optimizer)."""
        return sum(i.bytes for i in self.state if i.what.startswith(prefix))


def resolve_model(m: ModelConfig) -> ResolvedRun:
    """A model config alone resolved as a run (`rrtrain plan --size ...`): its rule, the preset's shape, counts."""
    return resolve_run(Config(model=m))


def resolve(m: ModelConfig) -> sizing.ModelShape:
    """The shape of a model config alone, its rule and preset checked."""
    return resolve_model(m).shape


def _adam(local: int, n_tensors: int) -> list[Item]:
    return [Item("optimizer: AdamW exp_avg + exp_avg_sq", "fp32", 8 * local),
            Item("optimizer: AdamW step counters", "fp32", 4 * n_tensors)]


def _held_single(s: Setup, lay: Layout) -> tuple[list[Item], list[Item]]:
    """One process: fp32 weights, gradients and moments, whole; autocast caches bf16 weight copies."""
    p = lay.numel
    state = [Item("parameters", "fp32", 4 * p), Item("gradients", "fp32", 4 * p), *_adam(p, len(lay.tensors))]
    transient = [Item("autocast bf16 weight copies", "bf16", 2 * p)] if s.precision == "bf16" else []
    return state, transient


UNSHARDED_GRADS = "unsharded gradients kept across micro-batches (no-sync accumulation)"


def _held_fsdp(s: Setup, lay: Layout, rank: int) -> tuple[list[Item], list[Item]]:
    """FSDP2 as rrtrain/parallel/fsdp.py applies it: every block a unit, then the root."""
    local = lay.shard_numel(s.shard, rank % s.shard)
    c, cdt = DTYPE_BYTES[storage(s.precision)], storage(s.precision)
    block, root = lay.block_numel(), lay.unit_numel(-1)
    state = [Item("parameters (sharded master)", "fp32", 4 * local), Item("gradients (sharded)", "fp32", 4 * local),
             *_adam(local, len(lay.tensors))]
    transient: list[Item] = []
    if s.shard > 1 or s.precision == "bf16":
        transient += [Item("gathered root (embeddings; kept through the step)", cdt, c * root),
                      Item("gathered blocks (current + prefetched)", cdt, 2 * c * block)]
    if s.shard > 1:  # FSDP2 copies the block's gradients into one fp32 buffer to reduce-scatter them
        transient += [Item("block gradient before reduce-scatter", cdt, c * block),
                      Item("reduce-scatter input (fp32 reduction)", "fp32", 4 * block)]
    if s.accum > 1 and s.shard > 1:
        p = lay.numel
        transient.append(Item(UNSHARDED_GRADS, "fp32", 4 * p))
    return state, transient


def _held_deepspeed(s: Setup, lay: Layout) -> tuple[list[Item], list[Item]]:
    """ZeRO's documented layout: stage 1 shards the moments and master weights, 2 also gradients, 3 also weights."""
    p, z, c = lay.numel, s.zero_stage, DTYPE_BYTES[storage(s.precision)]
    part = -(-p // s.gpus)
    state = [Item("parameters" + (" (bf16 working copy)" if s.precision == "bf16" else ""), storage(s.precision),
                  c * (part if z == 3 else p))]
    if s.precision == "bf16":
        state.append(Item("parameters (fp32 master, sharded)", "fp32", 4 * part))
    # counted as held through forward too: conservative, and not checked against DeepSpeed itself
    state += [Item("gradient accumulation buffers" + (" (sharded)" if z >= 2 else ""), "fp32",
                   4 * (part if z >= 2 else p)),
              Item("optimizer: AdamW exp_avg + exp_avg_sq (sharded)", "fp32", 8 * part)]
    gathered = Item("gathered blocks (current + prefetched)", storage(s.precision), 2 * c * lay.block_numel())
    transient = [gathered] if z == 3 else []
    return state, transient


def _held(s: Setup, lay: Layout, rank: int) -> tuple[list[Item], list[Item]]:
    """Held state and peak transient buffers of one rank (rank 0 holds the largest FSDP shards)."""
    if s.backend == "fsdp":
        return _held_fsdp(s, lay, rank)
    return _held_single(s, lay) if s.backend == "none" else _held_deepspeed(s, lay)


def _warnings(s: Setup, transient: list[Item], usable: int) -> list[str]:
    """Say so when no-sync accumulation costs more than 5% of the GPU."""
    kept = sum(i.bytes for i in transient if i.what == UNSHARDED_GRADS)
    if kept <= 0.05 * usable:
        return []
    return [f"accumulating {s.accum} micro-batches: the trainer's FSDP path skips the reduce-scatter until the "
            f"last one and keeps every unsharded gradient in fp32 ({kept / 2**30:.1f} GiB per rank); reach the "
            f"global batch with a larger micro-batch or more GPUs instead"]


def comm_bytes_per_step(s: Setup, lay: Layout) -> int:
    """Bytes each rank sends per optimizer step with ring collectives ((n-1)/n of the buffer each)."""
    p, c = lay.numel, DTYPE_BYTES[storage(s.precision)]
    if s.backend == "none" or s.gpus == 1:
        return 0
    w, r = s.shard, s.gpus // s.shard
    ring = (w - 1) / w
    if s.backend == "fsdp":
        gathers = 1 + (1 if s.reshard_after_forward else 0)  # forward, and again in backward
        gather = s.accum * (gathers * (p - lay.unit_numel(-1)) + lay.unit_numel(-1)) * c * ring
        scatter = 4 * p * ring  # fp32 reduce-scatter, once per step
        replicate = 2 * 4 * (p / w) * (r - 1) / r if r > 1 else 0.0  # HSDP: all-reduce of the shards
        return int(gather + scatter + replicate)
    ring = (s.gpus - 1) / s.gpus
    gather = c * p * ring * (1 + s.accum * 2 if s.zero_stage == 3 else 1)  # updated weights (+ ZeRO-3 gathers)
    return int(gather + 4 * p * ring)  # fp32 gradient reduce-scatter


def plan(s: Setup, rank: int = 0) -> Plan:
    """Memory per rank (rank 0 unless told), communication and time for one run."""
    check(s)
    run = s.run or resolve_model(s.model)
    shape = run.shape
    lay = layout(s.model, shape, run.rule)
    state, transient = _held(s, lay, rank)
    autocast = s.backend == "none" and s.precision == "bf16"
    prof = activation_profile(s.model, shape, storage(s.precision), autocast, run.rule)
    acts = {mode: s.micro_batch * (prof.saved(shape.n_layers, mode, s.ac_every)
                                   + (prof.per_block if mode != "none" else 0)  # one block recomputed
                                   + prof.loss_grad)
            for mode in AC_MODES}
    peak, capacity = gpu_spec(s.gpu, s.precision)
    fpt = run.flops_per_token
    recompute = checkpointed_blocks(shape.n_layers, s.ac, s.ac_every) / shape.n_layers
    time_s = gpu_hours = None
    if s.tokens is not None:
        time_s = s.tokens * fpt * (1.0 + recompute / 3.0) / (s.gpus * peak * s.mfu)
        gpu_hours = time_s * s.gpus / 3600.0
    return Plan(setup=s, shape=shape, params=run.params,
                state=tuple(state), transient=tuple(transient), activations=acts, capacity=capacity,
                comm_bytes=comm_bytes_per_step(s, lay), flops_per_token=fpt,
                tokens_per_step=s.batch * shape.seq_len, time_s=time_s, gpu_hours=gpu_hours,
                warnings=tuple(_warnings(s, transient, int(capacity * (1.0 - HEADROOM)))))


def fitting(s: Setup, micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> list[Plan]:
    """Every (AC mode, micro-batch) that fits, keeping the global batch when it was given."""
    out = []
    for ac in AC_MODES:
        for mb in micro_batches:
            if s.global_batch is not None and s.global_batch % (mb * s.gpus):
                continue
            p = plan(dataclasses.replace(s, ac=ac, micro_batch=mb))
            if p.fits:
                out.append(p)
    return out


def recommended(fits: list[Plan]) -> Optional[Plan]:
    """The setting to run of those that fit: the least recomputation (AC none, then selective, then full), then
    the largest micro-batch (the GPU fed best without recomputing); None when nothing fits."""
    if not fits:
        return None
    return min(fits, key=lambda p: (AC_MODES.index(p.setup.ac), -p.setup.micro_batch))

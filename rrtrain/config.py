"""Typed configuration: every setting of a run, as dataclasses with their rules, validated.

Every run is a function of this object and its seed, so everything that changes a run lives here. How YAML
files and `a.b=c` overrides become one is `rrtrain.config_load`'s; bad input is a one-line `UsageError` that
names the key.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from rrtrain.core.errors import UsageError
import rrtrain.schedule as lr_schedule
from rrtrain.config_load import apply_overrides, build, read_yaml

# ---------------------------------------------------------------------------------------------
# Per-key rules, written on the fields themselves (`field(metadata=...)`) and read by the functions at the end
# of this module (`resume_rule`, `sweep_axes`, `is_setting`, ...). A section's rule holds for every key under
# it unless a field below says otherwise; a field without one reads as the defaults below.

#: `resume`: what a resume does when the key's value differs from the checkpoint's (rrtrain.training.checkpoint)
RESUME_RULES = ("free", "layout", "consent", "never")
#: the key never changes a step: resumed silently (a cadence, an observer, where the records also go)
FREE = types.MappingProxyType({"resume": "free"})
#: the parallel layout: resumed without consent and listed (DCP reshards the saved state exactly)
LAYOUT = types.MappingProxyType({"resume": "layout"})
#: the saved state cannot be loaded with another value: refused even with `train.allow_config_change`
NEVER = types.MappingProxyType({"resume": "never"})
#: `axis`: one of the axes a sweep expands (its sizes, variants, seeds, run directories); a run may not override it
AXIS = types.MappingProxyType({"axis": True})
#: `setting`: False for a key that tells runs of one setting apart (seed, name, directory, grid label) rather
#: than being part of the setting (sweep pruning groups runs by their settings)
NOT_A_SETTING = types.MappingProxyType({"setting": False})
#: a field without metadata: a changed value needs `train.allow_config_change`; no axis; a setting
DEFAULT_RULES = types.MappingProxyType({"resume": "consent", "axis": False, "setting": True})

#: what `rrtrain plan` and a sweep's GPU-hour estimate assume when no GPU or MFU is named
DEFAULT_GPU = "h100"
DEFAULT_MFU = 0.40
#: DeepSpeed's ZeRO stages (`parallel.zero_stage`)
ZERO_STAGES = (1, 2, 3)


@dataclass
class RunConfig:
    # the run directory: config.yaml, metrics.jsonl, tb/, checkpoints/, final.json
    dir: str = field(default="runs/default", metadata={**FREE, **AXIS, **NOT_A_SETTING})
    # free-form label; defaults to the directory's name
    name: str = field(default="", metadata={**FREE, **NOT_A_SETTING})
    # a second copy of this run waits this long for the run dir's lock, then exits 73
    lock_wait_s: float = field(default=120.0, metadata=FREE)
    # a sweep's grid point this run is ({"train.lr": 0.003}): a label
    point: dict = field(default_factory=dict, metadata=NOT_A_SETTING)


@dataclass
class ModelConfig:
    size: str = field(default="tiny", metadata=AXIS)  # a preset from configs/sizes/
    variant: str = field(default="standard", metadata=AXIS)  # a residual rule's name (rrtrain.residuals.names())
    d_model: Optional[int] = None  # None: the preset's value
    n_layers: Optional[int] = None  # blocks; a block is two sublayers (attention, MLP)
    n_heads: Optional[int] = None
    d_ff: Optional[int] = None  # None: the preset's, else 4 * d_model
    seq_len: Optional[int] = None
    vocab_size: Optional[int] = None  # None: the preset's (50257) or, in training, the dataset's
    pos: Literal["learned", "rope"] = "learned"
    norm_eps: float = 1e-6
    init_std: float = 0.02  # GPT-2 initialisation; output projections get init_std / sqrt(2 * n_layers)
    rope_base: float = 10000.0
    # hyperparameter transfer (docs/transfer.md): sp, GPT-2's (as always); mup, across width; completep, across
    # width and depth, branches x (n_layers / base_n_layers)^-alpha (alpha 0.5: depth-muP). The base shape's
    # d_model and n_layers default to the tiny preset's
    parametrization: Literal["sp", "mup", "completep"] = "sp"
    base_d_model: Optional[int] = None
    base_n_layers: Optional[int] = None
    alpha: float = 1.0
    # attention block-diagonal by document within each packed row (documents end at the dataset's end-of-document
    # token), causal inside each; false: across documents, as prep packed them (docs/configuration.md)
    doc_mask: bool = False
    # with doc_mask: positions (learned or RoPE) restart at each document's first token (None: "restart"), or
    # "continue" over the row; refused without doc_mask
    doc_positions: Optional[Literal["restart", "continue"]] = None
    # with doc_mask: the end-of-document token id; None: the dataset's (its manifest's eos_id), filled in when a
    # run resolves against its dataset and recorded in config.yaml
    eod_id: Optional[int] = None
    # the residual rule's knobs (`gate_rank: 8`): each rule declares its own (rrtrain.residuals), so this section
    # is a plain mapping here, checked against the rules of model.variant and match.reference by rrtrain.knobs;
    # a resolved run records every knob of those rules (rrtrain.resolve)
    residual: dict = field(default_factory=dict)


@dataclass
class MatchConfig:
    """Parameter matching: widen this run's variant until its count is within `tolerance` of `reference`'s."""

    reference: Optional[str] = None  # e.g. review: the paper's "parameter-matched up to Review by widening"
    widen: Literal["mlp", "model"] = "mlp"
    tolerance: float = 0.005


@dataclass
class DataConfig:
    # a directory written by `rrtrain prep` (or a remote URL streaming can read)
    path: Optional[str] = field(default=None, metadata=NEVER)
    # a weighted mixture instead: [{path, weight, name}], name defaulting to the directory's (rrtrain.data.sources)
    sources: Optional[list[dict]] = field(default=None, metadata=NEVER)
    num_canonical_nodes: int = 1  # pinned so the sample order is the same on any number of nodes
    num_workers: int = field(default=0, metadata=FREE)
    shuffle: bool = True
    # local cache for remote/compressed data, one per node; None = RUN/data_cache/HOST
    cache_dir: Optional[str] = field(default=None, metadata=FREE)
    eval_batches: int = 4  # fixed validation micro-batches per rank per evaluation (per source of a mixture)

    def __post_init__(self) -> None:
        from rrtrain.data.sources import normalise

        self.sources = normalise(self.path, self.sources)


@dataclass
class TrainConfig:
    seed: int = field(default=0, metadata={**NEVER, **AXIS, **NOT_A_SETTING})
    max_steps: Optional[int] = None  # wins over `tokens` when set
    tokens: Optional[int] = None  # the token budget; steps = tokens // (global_batch * seq_len)
    global_batch: int = 8  # sequences per optimizer step, whatever the world size
    # sequences per rank per forward/backward; "auto" (CUDA only): the largest that divides global_batch / world
    # size and that the planner fits in the GPU's free memory (rrtrain/parallel/auto_batch.py)
    micro_batch: Union[int, Literal["auto"]] = 8
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # the decay's floor as a fraction of lr
    warmup_steps: Optional[int] = None  # None: 5% of the steps (at least 1)
    # the rate after the warmup; wsd: stable, then a decay over the run's last decay_steps (else decay_fraction,
    # 0.2) steps shaped linear (the default), cosine or 1-sqrt. Formulas, extension: rrtrain/schedule.py
    schedule: Literal["cosine", "wsd", "linear", "constant"] = "cosine"
    decay_shape: Optional[Literal["linear", "cosine", "1-sqrt"]] = None
    decay_fraction: Optional[float] = None
    decay_steps: Optional[int] = None
    # RUN_DIR@STEP: a new run from that checkpoint of another run, with its full state (training/continuation.py)
    branch_from: Optional[str] = field(default=None, metadata=NEVER)
    weight_decay: float = 0.1  # on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping
    log_every: int = field(default=10, metadata=FREE)
    eval_every: int = field(default=100, metadata=FREE)  # 0: only at the end
    ckpt_every: int = field(default=0, metadata=FREE)  # 0: only at the end and on a signal
    artifact_every: int = field(default=0, metadata=FREE)  # RUN/artifact/step_N/ (weights + model.json); 0: the end
    keep_ckpts: int = field(default=2, metadata=FREE)
    # write checkpoints in the background (DCP async save); fsdp / none backends only
    ckpt_async: bool = field(default=False, metadata=FREE)
    diag_every: int = field(default=0, metadata=FREE)  # per-block gradient norms and gate statistics; 0: off
    on_nonfinite: Literal["skip", "halt"] = "skip"
    max_nonfinite: int = 5  # consecutive non-finite steps before the run halts as diverged
    stop_check_every: int = 10  # steps between the all-ranks checks for a stop signal (a host sync each)
    allow_config_change: bool = field(default=False, metadata=FREE)  # resume despite changed (safe-to-change) settings
    # resume from a checkpoint without its files manifest (unchecked)
    allow_unverified_checkpoint: bool = field(default=False, metadata=FREE)
    # torch.compile each block; auto: see rrtrain/parallel/compile_policy.py
    compile: Union[bool, Literal["auto"]] = field(default="auto", metadata=FREE)
    fail_at_step: Optional[int] = field(default=None, metadata=FREE)  # testing: inject a NaN loss at this step ...
    fail_steps: int = field(default=1, metadata=FREE)  # ... and at the steps after it, this many in all
    # your own, as `module.path:ClassName` (docs/user-guide.md). Free on resume: a callback observes and may stop the
    # run without changing a step (one added on resume starts from its defaults; a removed one's state is left unread)
    callbacks: list[str] = field(default_factory=list, metadata=FREE)


@dataclass
class ParallelConfig:
    backend: Literal["none", "fsdp", "deepspeed"] = field(default="none", metadata=NEVER)
    zero_stage: int = 2
    ac: Literal["none", "full", "selective"] = field(default="none", metadata=FREE)
    ac_every: int = field(default=2, metadata=FREE)  # selective: checkpoint every k-th block
    precision: Literal["fp32", "fp32_tf32", "bf16"] = "fp32"
    reshard_after_forward: bool = field(default=True, metadata=FREE)
    timeout_s: int = field(default=600, metadata=FREE)  # collective timeout
    # FSDP's 2-D mesh (HSDP): shard over dp_shard ranks, replicate over dp_replicate groups; product = world size
    # (rrtrain/parallel/mesh.py). Unset: shard over every rank; one set alone: the other is world / it.
    dp_shard: Optional[int] = field(default=None, metadata=LAYOUT)
    dp_replicate: Optional[int] = field(default=None, metadata=LAYOUT)
    # float8 training of the large linear layers through torchao (rrtrain/parallel/float8.py): off, rowwise or
    # tensorwise; needs a GPU of compute capability 8.9 or more and `pip install 'rrtrain[float8]'`
    float8: Union[Literal["off", "rowwise", "tensorwise"], bool] = "off"

    def __post_init__(self) -> None:
        if self.float8 is False:  # YAML reads a bare `off` as false
            self.float8 = "off"
        elif self.float8 is True:
            raise UsageError("parallel.float8: expected one of 'off', 'rowwise', 'tensorwise', got true")


@dataclass
class MonitorConfig:
    """Convergence monitoring (rrtrain.monitoring.callback in a run, launchers.state.flags across a sweep); docs/user-guide.md
    "Monitoring" says how each default was chosen."""

    min_steps: int = 200  # no stall is called before this step (nor before warmup ends)
    window: int = 100  # steps over which the smoothed loss must improve; also the spike statistics' window
    min_improvement: float = 0.01  # relative improvement of the smoothed loss over `window` below which it has stalled
    entropy_margin: float = 0.1  # nats: a stall counts while the smoothed loss is above unigram entropy - margin
    grad_ratio: float = 0.01  # vanishing_gradient: first block's grad norm < grad_ratio x the last block's
    spike_sigma: float = 4.0  # diverged: loss > smoothed loss + spike_sigma x std of the recent losses ...
    spike_patience: int = 10  # ... for this many steps in a row
    on_stall: Literal["flag", "stop"] = "flag"  # stop: checkpoint, final.json status stalled, exit 4
    on_diverge: Literal["flag", "stop"] = "flag"  # stop: checkpoint, final.json status diverged, exit 3
    heartbeat_s: float = 1800.0  # sweep: a running job with no new step for this long is flagged no_heartbeat
    peer_mad: float = 5.0  # sweep: lagging = loss above the peers' median by this many median absolute deviations


@dataclass
class WandbConfig:
    """`log.wandb`: the run's scalars, config, flags and outcome also go to Weights & Biases (rank 0;
    `pip install 'rrtrain[wandb]'`; rrtrain.monitoring.wandb_logger). Unset, wandb is never imported."""

    project: Optional[str] = None  # None: WANDB_PROJECT, else W&B's default
    entity: Optional[str] = None  # None: WANDB_ENTITY, else your default entity
    mode: Optional[Literal["online", "offline", "disabled"]] = None  # None: WANDB_MODE, else online
    group: Optional[str] = None  # runs of `rrtrain sweep` default to the sweep directory's name


@dataclass
class LogConfig:
    """Where a run's records go besides metrics.jsonl and TensorBoard (which are always written)."""

    # a mapping (may be empty: `log.wandb: {}`) turns W&B on
    wandb: Optional[WandbConfig] = field(default=None, metadata=FREE)


@dataclass
class DownstreamConfig:
    """`eval.downstream`: lm-evaluation-harness tasks evaluated inside training at checkpoint steps and at the
    last step (rrtrain.eval.callback; docs/evaluation.md). No tasks: off, and lm_eval is never imported."""

    tasks: list[str] = field(default_factory=list)  # lm-eval task names (registry or `include`)
    every: Optional[int] = None  # None: at every checkpoint (train.ckpt_every); 0: at the last step only
    limit: Optional[int] = None  # the first K documents of each task
    num_fewshot: Optional[int] = None  # None: each task's own, else 0
    include: Optional[str] = None  # a directory or YAML file of your own tasks (lm-eval's include_path)
    batch_size: int = 16  # sequences per forward, per rank


@dataclass
class EvalConfig:
    # resumed freely: an evaluation observes the model between steps and leaves its random state as it found it
    downstream: DownstreamConfig = field(default_factory=DownstreamConfig, metadata=FREE)


@dataclass
class InitConfig:
    """`init.from: RUN_DIR[@STEP] | EXPORT_DIR | hf:PATH`: a new run's weights (only: fresh optimizer and
    schedule) from another run, an export or a Hugging Face checkpoint; checked in rrtrain/artifact/warm.py."""

    from_: Optional[str] = None  # the key is `init.from` (a Python keyword: `build` maps it)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig, metadata=NEVER)  # a checkpoint holds this shape
    match: MatchConfig = field(default_factory=MatchConfig, metadata=NEVER)  # ... and this matched width
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # judges the trajectory, never changes it
    monitor: MonitorConfig = field(default_factory=MonitorConfig, metadata=FREE)
    log: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    init: InitConfig = field(default_factory=InitConfig, metadata=FREE)  # a resume loads its own checkpoint

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(path: str | Path | None, overrides: list[str] | None = None, sha256: Optional[str] = None) -> Config:
    """Read YAML (if any; with `sha256`, a file of that digest), apply overrides, build and validate a `Config`
    (`rrtrain.resolve.load` also checks it against the residual rules and size presets)."""
    data = read_yaml(path, sha256=sha256) if path is not None else {}
    data = apply_overrides(data, overrides or [])
    cfg = build(Config, data)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Reject impossible settings with a one-line reason naming the key. The checks against the residual rules
    (the variant, `model.residual`'s knobs) and the size presets are `rrtrain.resolve.check_model`'s (this
    module imports neither)."""
    m, t, p = cfg.model, cfg.train, cfg.parallel
    positive = {
        "train.lr": t.lr, "train.global_batch": t.global_batch,
        "train.micro_batch": 1 if t.micro_batch == "auto" else t.micro_batch,
        "train.log_every": t.log_every, "train.keep_ckpts": t.keep_ckpts, "train.max_nonfinite": t.max_nonfinite,
        "train.stop_check_every": t.stop_check_every,
        "model.init_std": m.init_std, "model.norm_eps": m.norm_eps, "parallel.timeout_s": p.timeout_s,
        "parallel.ac_every": p.ac_every, "match.tolerance": cfg.match.tolerance,
        "data.eval_batches": cfg.data.eval_batches,  # an evaluation of no batch would have no loss
    }
    for key, value in positive.items():
        if not value > 0:
            raise UsageError(f"{key} must be positive, got {value}")
    non_negative = {
        "train.weight_decay": t.weight_decay, "train.grad_clip": t.grad_clip, "train.eval_every": t.eval_every,
        "train.ckpt_every": t.ckpt_every, "train.diag_every": t.diag_every,
        "train.artifact_every": t.artifact_every, "data.num_workers": cfg.data.num_workers,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise UsageError(f"{key} must not be negative, got {value}")
    if t.max_steps is not None and t.max_steps < 1:
        raise UsageError(f"train.max_steps must be at least 1, got {t.max_steps}")
    if t.tokens is not None and t.tokens < 1:
        raise UsageError(f"train.tokens must be at least 1, got {t.tokens}")
    if t.warmup_steps is not None and t.warmup_steps < 0:
        raise UsageError(f"train.warmup_steps must not be negative, got {t.warmup_steps}")
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        raise UsageError(f"train.min_lr_ratio must be in [0, 1], got {t.min_lr_ratio}")
    for key, beta in (("train.beta1", t.beta1), ("train.beta2", t.beta2)):
        if not 0.0 <= beta < 1.0:
            raise UsageError(f"{key} must be in [0, 1), got {beta}")
    if p.zero_stage not in ZERO_STAGES:
        raise UsageError(f"parallel.zero_stage must be 1, 2 or 3, got {p.zero_stage}")
    for key, value in (("parallel.dp_shard", p.dp_shard), ("parallel.dp_replicate", p.dp_replicate)):
        if value is not None and value < 1:
            raise UsageError(f"{key} must be positive, got {value}")
        if value is not None and p.backend != "fsdp":
            raise UsageError(f"{key} applies to parallel.backend=fsdp only (got backend '{p.backend}')")
    if p.float8 != "off" and p.backend == "deepspeed":
        raise UsageError(f"parallel.float8={p.float8} needs parallel.backend=fsdp or none (torchao's float8 "
                         "layers are not wired into DeepSpeed)")
    if p.float8 != "off" and p.precision != "bf16":
        raise UsageError(f"parallel.float8={p.float8} needs parallel.precision=bf16 (float8 matmuls inside bf16 "
                         f"training), got '{p.precision}'")
    if t.ckpt_async and p.backend == "deepspeed":
        raise UsageError("train.ckpt_async=true needs parallel.backend=fsdp or none (DeepSpeed writes its own "
                         "checkpoints synchronously)")
    lr_schedule.validate(t)
    validate_callbacks(t.callbacks)
    validate_monitor(cfg.monitor)
    if cfg.log.wandb is not None:
        validate_wandb(cfg.log.wandb)
    validate_downstream(cfg.eval.downstream, t.ckpt_every)


#: a task name of `eval.downstream.tasks` (result files and metric names are made of them)
TASK_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def validate_downstream(d: DownstreamConfig, ckpt_every: int) -> None:
    """Task names spelled as lm-eval's are (whether lm-eval knows them is checked when the run starts, before
    anything is written); evaluations fall on checkpoint steps, so `rrtrain eval --step S` repeats them."""
    for name in d.tasks:
        if not TASK_NAME.fullmatch(name):
            raise UsageError(f"eval.downstream.tasks: {name!r} is not a task name (letters, digits, '_', '.', '-')")
    repeated = sorted({t for t in d.tasks if d.tasks.count(t) > 1})
    if repeated:
        raise UsageError(f"eval.downstream.tasks: {repeated[0]!r} is listed twice")
    if d.batch_size < 1:
        raise UsageError(f"eval.downstream.batch_size must be positive, got {d.batch_size}")
    if d.limit is not None and d.limit < 1:
        raise UsageError(f"eval.downstream.limit must be at least 1 (or null: every document), got {d.limit}")
    if d.num_fewshot is not None and d.num_fewshot < 0:
        raise UsageError(f"eval.downstream.num_fewshot must not be negative, got {d.num_fewshot}")
    if d.every is not None and d.every < 0:
        raise UsageError(f"eval.downstream.every must not be negative, got {d.every}")
    if d.tasks and d.every and (ckpt_every == 0 or d.every % ckpt_every):
        raise UsageError(f"eval.downstream.every={d.every} must be a multiple of train.ckpt_every={ckpt_every} "
                         "(evaluations fall on checkpoint steps); null: at every checkpoint, 0: at the last step")


#: `package.module:ClassName`: a callback class to import (rrtrain.train loads it)
CALLBACK_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def validate_callbacks(paths: list[str]) -> None:
    for path in paths:
        if not CALLBACK_PATH.fullmatch(path):
            raise UsageError(f"train.callbacks: {path!r} is not of the form 'module.path:ClassName'")
    repeated = sorted({p for p in paths if paths.count(p) > 1})
    if repeated:
        raise UsageError(f"train.callbacks: {repeated[0]!r} is listed twice")


def validate_monitor(mon: MonitorConfig) -> None:
    positive = {"monitor.window": mon.window, "monitor.spike_sigma": mon.spike_sigma,
                "monitor.spike_patience": mon.spike_patience, "monitor.heartbeat_s": mon.heartbeat_s,
                "monitor.peer_mad": mon.peer_mad}
    for key, value in positive.items():
        if not value > 0:
            raise UsageError(f"{key} must be positive, got {value}")
    non_negative = {"monitor.min_steps": mon.min_steps, "monitor.min_improvement": mon.min_improvement,
                    "monitor.entropy_margin": mon.entropy_margin, "monitor.grad_ratio": mon.grad_ratio}
    for key, value in non_negative.items():
        if value < 0:
            raise UsageError(f"{key} must not be negative, got {value}")


#: characters W&B refuses in a project name (and that have no place in an entity's)
WANDB_RESERVED = "/\\#?%:"


def validate_wandb(w: WandbConfig) -> None:
    for key, value in (("project", w.project), ("entity", w.entity), ("group", w.group)):
        if value is None:
            continue
        if not value.strip() or len(value) > 128:
            raise UsageError(f"log.wandb.{key} must be 1 to 128 characters, got {value!r}")
        bad = sorted({c for c in value if c in WANDB_RESERVED}) if key != "group" else []
        if bad:
            raise UsageError(f"log.wandb.{key}: W&B refuses the characters {''.join(bad)!r} in {value!r}")


# ---------------------------------------------------------------------------------------------
# Per-key rules, read from the fields' metadata (written at the top of this module)


def _fields(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """A dataclass's fields with their resolved types, by name (cached: the schema's classes do not change)."""
    cached = _FIELDS.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = _FIELDS[cls] = {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}
    return cached


_FIELDS: dict[type, dict[str, tuple[dataclasses.Field, Any]]] = {}


def _section(tp: Any) -> Optional[type]:
    """The dataclass a field of this type holds (an Optional one unwrapped), or None for a leaf."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = inner[0] if len(inner) == 1 else tp
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def key_rules(key: str) -> dict[str, Any]:
    """The rules of a dotted key (`train.lr`, `log.wandb.project`, `run.point.train.lr`): the deepest field on its
    path that says a rule wins. A key under a free-form mapping (`run.point`) has that mapping's rules. A key the
    schema does not know (a setting an older rrtrain had) needs consent on resume, unless a section above it can
    never change."""
    rules = dict(DEFAULT_RULES)
    cls: Optional[type] = Config
    free_form = False
    for part in key.split("."):
        if free_form:  # a free-form mapping's own keys: the mapping's rules
            break
        found = _fields(cls).get(part) if cls is not None else None
        if found is None:
            return {**DEFAULT_RULES, "resume": "never" if rules["resume"] == "never" else "consent"}
        f, tp = found
        rules.update(f.metadata)
        cls, free_form = _section(tp), _is_mapping(tp)
    return rules


def _is_mapping(tp: Any) -> bool:
    """A free-form mapping field (`run.point`): its keys are the user's, not the schema's."""
    return tp is dict or typing.get_origin(tp) is dict


def choices(cls: type, name: str) -> tuple:
    """The values a `Literal` field allows (`choices(ParallelConfig, "backend")`), in the schema's order; the
    planner's flags check against the same lists as the config."""
    tp = _fields(cls)[name][1]
    if typing.get_origin(tp) is not Literal:
        raise TypeError(f"{cls.__name__}.{name} is not a Literal field")
    return typing.get_args(tp)


def resume_rule(key: str) -> str:
    """What a resume does when `key` changed: free, layout, consent or never (RESUME_RULES)."""
    return key_rules(key)["resume"]


def is_setting(key: str) -> bool:
    """Whether `key` is part of a run's setting, as opposed to telling the runs of one setting apart (the seed,
    name, directory, and every key of the grid label `run.point`)."""
    return bool(key_rules(key)["setting"])


def schema_keys(cls: type = Config, prefix: str = "", inherited: Optional[dict] = None) -> dict[str, dict[str, Any]]:
    """Every key of the schema with its rules, in declaration order: each leaf, and each optional section as a key
    of its own too (unset, it is one value: `log.wandb: null`). A free-form mapping (`run.point`) is one key,
    marked `free_form` (`model.residual` too: its keys are the rules')."""
    out: dict[str, dict[str, Any]] = {}
    for name, (f, tp) in _fields(cls).items():
        key, rules = f"{prefix}{name}", {**(inherited or DEFAULT_RULES), **f.metadata}
        inner = _section(tp)
        if inner is None:
            out[key] = {**rules, "free_form": _is_mapping(tp)}
        else:
            if tp is not inner:  # an optional section: unset, it is a value of its own
                out[key] = {**rules, "free_form": False}
            out.update(schema_keys(inner, key + ".", rules))
    return out


def keys_with_resume(rule: str) -> frozenset[str]:
    """The schema's keys whose resume rule is `rule` (see RESUME_RULES)."""
    if rule not in RESUME_RULES:
        raise ValueError(f"resume rule must be one of {', '.join(RESUME_RULES)}, got {rule!r}")
    return frozenset(k for k, r in schema_keys().items() if r["resume"] == rule)


def sweep_axes() -> tuple[str, ...]:
    """The keys a sweep expands into runs (run directory, size, variant, seed), in schema order."""
    return tuple(k for k, r in schema_keys().items() if r["axis"])


def keys_a_grid_may_not_move() -> tuple[str, ...]:
    """The sweep's axes and the keys that name a run (`run.name`, `run.point`): a grid key may be none of them."""
    return tuple(k for k, r in schema_keys().items() if r["axis"] or not r["setting"])

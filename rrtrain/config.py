"""Typed configuration: YAML files and `a.b=c` overrides, validated into dataclasses.

Every run is a function of this object and its seed, so everything that changes a run lives here.
Bad input raises `UsageError` with a one-line message that names the key: an unknown key suggests the
closest valid one, a wrong type says what was expected and what was given.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from rrtrain.core.files import LIMITS, load_yaml as load_untrusted_yaml, read_named as read_untrusted
from rrtrain.core.errors import UsageError

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
    num_canonical_nodes: int = 1  # pinned so the sample order is the same on any number of nodes
    num_workers: int = field(default=0, metadata=FREE)
    shuffle: bool = True
    # local cache for remote/compressed data, one per node; None = RUN/data_cache/HOST
    cache_dir: Optional[str] = field(default=None, metadata=FREE)
    eval_batches: int = 4  # fixed validation micro-batches per rank per evaluation


@dataclass
class TrainConfig:
    seed: int = field(default=0, metadata={**NEVER, **AXIS, **NOT_A_SETTING})
    max_steps: Optional[int] = None  # wins over `tokens` when set
    tokens: Optional[int] = None  # the token budget; steps = tokens // (global_batch * seq_len)
    global_batch: int = 8  # sequences per optimizer step, whatever the world size
    # sequences per rank per forward/backward; "auto" (CUDA only): the largest that divides global_batch / world
    # size and that the planner fits in the GPU's free memory (rrtrain/planning/auto_batch.py)
    micro_batch: Union[int, Literal["auto"]] = 8
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    warmup_steps: Optional[int] = None  # None: 5% of the steps (at least 1)
    weight_decay: float = 0.1  # on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping
    log_every: int = field(default=10, metadata=FREE)
    eval_every: int = field(default=100, metadata=FREE)  # 0: only at the end
    ckpt_every: int = field(default=0, metadata=FREE)  # 0: only at the end and on a signal
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Building typed objects from plain data


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + (" or null" if type(None) in typing.get_args(tp) else "")
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and gently convert) `value` against the annotation `tp`; raise a one-line UsageError."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**63 - 1:
        # beyond any setting, and beyond what Python prints past 4,300 digits: refused before any message shows it
        raise UsageError(f"{key}: an integer of {len(str(abs(value))) if abs(value) < 10**4000 else 'thousands of'} "
                         "digits is not a setting")
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            if dataclasses.is_dataclass(arg) and isinstance(value, dict):  # its own errors name the key
                return build(arg, value, key)
            try:
                return _coerce(value, arg, key)
            except UsageError:
                pass
        raise UsageError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(f"{key}: expected {_type_name(tp)}, got {value!r}{hint}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise UsageError(f"{key}: expected a boolean (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise UsageError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                f = float(value.replace("_", ""))
            except ValueError:
                f = None
            if f is not None and f.is_integer():
                return int(f)
        raise UsageError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise UsageError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(number):  # every number of a config is meant finite: inf/nan would run as nonsense
            raise UsageError(f"{key}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise UsageError(f"{key}: expected a string, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin is list:  # a typed list: every item checked
        if not isinstance(value, list):
            raise UsageError(f"{key}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp in (list, dict):  # free-form fields (sweep files: lists of sbatch lines, maps of overrides)
        if isinstance(value, tp):
            return value
        raise UsageError(f"{key}: expected a {'list' if tp is list else 'mapping'}, got {value!r}")
    raise UsageError(f"{key}: unsupported type {tp!r}")


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys with a suggestion."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        where = prefix or "configuration"
        raise UsageError(f"{where}: expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"; did you mean '{(prefix + '.') if prefix else ''}{close[0]}'?" if close else ""
            valid = ", ".join(names)
            raise UsageError(f"unknown key '{full}'{hint} (valid here: {valid})")
        kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict:
    """Read a YAML mapping; `base: other.yaml` (relative to the file) is merged underneath. Every problem is a
    one-line UsageError naming the file: unreadable, not UTF-8, not YAML, not a mapping, a `base:` that is not a
    file name or that leads back to a file of its own chain."""
    path = Path(path)
    try:
        raw = read_untrusted(path, MAX_CONFIG_BYTES)
    except OSError as err:
        raise UsageError(f"cannot read config {path}: {err.strerror or type(err).__name__}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        data = load_untrusted_yaml(text)  # aliases and nesting bounded: a few lines could otherwise hang the reader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply to be a config") from None
    except ValueError as err:  # a value YAML reads but Python cannot hold, e.g. an integer of 5,000 digits
        raise UsageError(f"{path}: not a config ({str(err).splitlines()[0][:120]})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str) or not base.strip() or "\0" in base:
            raise UsageError(f"{path}: base: expected a file name, got {type(base).__name__}")
        try:
            here = path.resolve()
            target = (path.parent / base).resolve()
        except (OSError, RuntimeError):  # a loop of symbolic links (RuntimeError on Python 3.11, OSError later)
            raise UsageError(f"{path}: base: {base!r} cannot be resolved (a loop of symbolic links?)") from None
        chain = _chain + (here,)
        if target in chain:
            loop = " -> ".join(p.name for p in chain[chain.index(target):]) + f" -> {target.name}"
            raise UsageError(f"{path}: base: {base!r} leads back to itself ({loop})")
        if len(chain) >= MAX_BASE_DEPTH:
            raise UsageError(f"{path}: base: more than {MAX_BASE_DEPTH} configs deep")
        data = _merge(read_yaml(path.parent / base, chain), data)
    return data


#: a config file larger than this is not one (a mistaken path to a dataset or a device)
MAX_CONFIG_BYTES = LIMITS["config"]
#: `base:` chains longer than this are refused (a chain of distinct files that never ends would exhaust the stack)
MAX_BASE_DEPTH = 32


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (['a', 'b'], value parsed as YAML)."""
    if "=" not in text:
        raise UsageError(f"override '{text}' is not of the form key.sub=value")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in parts):
        raise UsageError(f"override '{text}' has an empty key")
    try:
        value = load_untrusted_yaml(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):  # ValueError: e.g. an integer of 5,000 digits
        value = raw
    return parts, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = dict(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
            node[part] = dict(child)
            node = node[part]
        node[parts[-1]] = value
    return data


def dotted_keys(data: dict, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as `{"a.b.c": value}`, the form overrides, grids and resume checks name keys in."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(dotted_keys(value, full + "."))
        else:
            out[full] = value
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read YAML (if any), apply overrides, build and validate a `Config` (`rrtrain.resolve.load` also checks
    it against the residual rules and size presets)."""
    data = read_yaml(path) if path is not None else {}
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
        "data.num_workers": cfg.data.num_workers,
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

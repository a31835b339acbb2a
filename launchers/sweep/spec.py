"""The sweep file: a base training config, the axes variant x size x seed (and the points of a `grid:` of
training keys, per sweep, size or variant), resources per size.

Read with the same machinery as run configs (`rrtrain.config_load.build`): an unknown key names the closest valid
one, a wrong type says what was expected. Everything that cannot work (an unknown size or variant, a seed count
below one, resources a scheduler cannot grant) is refused here, before anything is written or submitted.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from data_prep.options import default as prep_default
from rrtrain.config import DEFAULT_GPU, DEFAULT_MFU, keys_a_grid_may_not_move
from rrtrain.config_load import _merge, apply_overrides, build, dotted_keys, read_yaml
from rrtrain.core import files
from rrtrain.core.errors import UsageError


@dataclass
class Resources:
    """What one run asks the scheduler for. `gpus_per_node: 0` is a CPU run (tests, the demo)."""

    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: Optional[int] = None  # None: one task per GPU (one when there is no GPU)
    cpus_per_task: int = 1
    mem_gb: float = 4.0
    time_min: int = 60
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    extra_sbatch: list = field(default_factory=list)  # more `#SBATCH` lines, e.g. "--exclusive"
    signal_delay_s: int = 120  # the time-limit warning (USR2) this long before the limit
    array_parallelism: int = 64  # at most this many runs of one array at a time (the `%N` throttle)
    max_requeues: int = 10  # time-limit requeues before a run is given up (submitit's max_num_timeout)

    @property
    def tasks(self) -> int:
        per_node = self.tasks_per_node if self.tasks_per_node is not None else max(1, self.gpus_per_node)
        return per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks


@dataclass
class PrepSpec:
    """Data the sweep prepares itself (once, into SWEEP_DIR/data) with `rrtrain prep`."""

    source: str = "synthetic:stories"
    tokenizer: str = prep_default("tokenizer")
    seq_len: int = prep_default("seq_len")
    num_docs: Optional[int] = None  # None: prep's own default
    val_fraction: Optional[float] = None
    seed: int = prep_default("seed")
    bos: bool = False  # a beginning-of-document token before each document (`rrtrain prep --bos`)
    bos_token: Optional[str] = None  # its name, where the tokenizer's is not one prep knows (`--bos-token`)
    tasks: int = 1  # more: tokenized in this many array tasks of the sweep's executor (`--executor --tasks`)


@dataclass
class SizeSpec:
    seeds: int = 1  # seeds 0 .. seeds-1
    tokens: Optional[int] = None  # the token budget of every variant at this size (train.tokens)
    overrides: dict = field(default_factory=dict)  # training keys for this size, e.g. {train.max_steps: 40}
    resources: dict = field(default_factory=dict)  # over the sweep's `resources`
    variants: Optional[list] = None  # the residual rules run at this size (default: the sweep's `variants`)
    grid: dict = field(default_factory=dict)  # training key -> values, over the sweep's `grid` (per key)


@dataclass
class SweepMonitor:
    """What the sweep does about flagged runs (the runs' own thresholds are `monitor.*` training keys)."""

    cancel: bool = False  # cancel stalled and diverged runs' jobs (launchers.cancel) on every status / local poll


@dataclass
class PruneSpec:
    """Successive halving over the runs of each (size, variant): `launchers.prune.rule` reads it."""

    rungs: list = field(default_factory=list)  # fractions of each run's steps (0.25) or step counts (100), rising
    keep: float = 0.5  # the fraction of a group's live points kept at each rung (rounded up; at least one)
    metric: str = "val_loss"  # val_loss | train_loss: what the points are ranked by (lower is better)
    smooth: Optional[int] = None  # the mean of the last N values up to the rung (default 1 for val, 10 for train)


PRUNE_METRICS = ("val_loss", "train_loss")


@dataclass
class SweepSpec:
    name: str = ""  # default: the sweep file's name
    config: str = ""  # the base training config, relative to the sweep file (or to configs/train/)
    data: Optional[str] = None  # data.path, relative to the sweep file; or use `prep`
    prep: Optional[PrepSpec] = None
    variants: list = field(default_factory=list)
    match: Optional[str] = None  # e.g. review: the other variants are widened to its parameter count per size
    sizes: dict = field(default_factory=dict)  # size preset -> SizeSpec
    overrides: dict = field(default_factory=dict)  # training keys for every run
    runs: dict = field(default_factory=dict)  # run id -> training keys for that run only
    resources: Resources = field(default_factory=Resources)
    gpu: str = DEFAULT_GPU  # for the GPU-hour estimate of --dry-run
    mfu: float = DEFAULT_MFU  # assumed model FLOPs utilisation, for the same estimate
    out: Optional[str] = None  # the sweep directory when --out is not given, relative to the sweep file
    monitor: SweepMonitor = field(default_factory=SweepMonitor)
    grid: dict = field(default_factory=dict)  # training key -> values: one run per point of the product
    variant_grid: dict = field(default_factory=dict)  # variant -> {training key -> values}, over the others
    prune: Optional[PruneSpec] = None  # successive halving across each (size, variant)'s points; None: off


@dataclass(frozen=True)
class Sweep:
    """A validated sweep file: the spec, where it came from, and its hash."""

    spec: SweepSpec
    path: Path
    sha256: str
    base_config: Path
    size_specs: dict  # size -> SizeSpec
    size_resources: dict  # size -> Resources


def flat_overrides(data: Any, where: str) -> dict[str, Any]:
    """`{train: {max_steps: 4}, "model.n_layers": 2}` -> `{"train.max_steps": 4, "model.n_layers": 2}`."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a mapping of training keys, got {data!r}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            for sub, v in flat_overrides(value, f"{where}.{key}").items():
                out[f"{key}.{sub}"] = v
        else:
            out[str(key)] = value
    return out


def load(path: str | Path, overrides: Optional[list[str]] = None) -> Sweep:
    """Read and validate a sweep file, with `key.sub=value` overrides of its own keys (e.g.
    `resources.partition=debug`); raises UsageError with a one-line reason."""
    from rrtrain import sizing

    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError):  # a loop of symbolic links (RuntimeError on Python 3.11, OSError later)
        raise UsageError(f"cannot read sweep file {path}: a loop of symbolic links") from None
    raw = apply_overrides(read_yaml(path), overrides or [])
    sha = hashlib.sha256(files.read_named(path) + "".join(f"\n{o}" for o in overrides or []).encode()).hexdigest()
    raw_prune = raw.pop("prune", None) if isinstance(raw, dict) else None
    spec: SweepSpec = build(SweepSpec, raw)
    spec.prune = parse_prune(raw_prune)
    spec.name = spec.name or path.stem
    if not spec.config:
        raise UsageError(f"{path.name}: 'config' is not set (the base training config, e.g. ../train/tiny.yaml)")
    base = _find_config(path, spec.config)
    if spec.data is not None and spec.prep is not None:
        raise UsageError("set either 'data' (a prepared directory) or 'prep' (the sweep prepares it), not both")
    if spec.prep is not None and spec.prep.tasks < 1:
        raise UsageError(f"prep.tasks must be at least 1, got {spec.prep.tasks}")
    if not spec.variants:
        raise UsageError("'variants' is empty: list the residual rules to compare, e.g. [review, highway, standard]")
    check_variants(list(spec.variants) + ([spec.match] if spec.match else []), "variants")
    if len(set(spec.variants)) != len(spec.variants):
        raise UsageError(f"variants: listed twice: {spec.variants}")
    if not spec.sizes:
        raise UsageError("'sizes' is empty: map size presets to their seeds, e.g. {rr-60m: {seeds: 3}}")
    presets = sizing.presets()
    size_specs: dict[str, SizeSpec] = {}
    size_resources: dict[str, Resources] = {}
    for size, body in spec.sizes.items():
        size = str(size)
        if size not in presets:
            close = difflib.get_close_matches(size, list(presets), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"sizes: unknown size preset '{size}'{hint}; known: {', '.join(presets)}")
        s: SizeSpec = build(SizeSpec, {"seeds": body} if isinstance(body, int) else body, f"sizes.{size}")
        if s.seeds < 1:
            raise UsageError(f"sizes.{size}.seeds must be at least 1, got {s.seeds}")
        if s.tokens is not None and s.tokens < 1:
            raise UsageError(f"sizes.{size}.tokens must be at least 1, got {s.tokens}")
        if s.variants is not None:
            if not s.variants or len(set(s.variants)) != len(s.variants):
                raise UsageError(f"sizes.{size}.variants must list each residual rule once, got {s.variants}")
            check_variants(s.variants, f"sizes.{size}.variants")
        s.overrides = flat_overrides(s.overrides, f"sizes.{size}.overrides")
        s.grid = parse_grid(s.grid, f"sizes.{size}.grid")
        merged = _merge(dataclasses.asdict(spec.resources), s.resources or {})
        res: Resources = build(Resources, merged, f"sizes.{size}.resources")
        check_resources(res, f"sizes.{size}.resources")
        size_specs[size], size_resources[size] = s, res
    check_resources(spec.resources, "resources")
    spec.overrides = flat_overrides(spec.overrides, "overrides")
    spec.runs = {str(k): flat_overrides(v, f"runs.{k}") for k, v in (spec.runs or {}).items()}
    spec.grid = parse_grid(spec.grid, "grid")
    spec.variant_grid = parse_variant_grid(spec.variant_grid, spec)
    if not 0 < spec.mfu <= 1:
        raise UsageError(f"mfu must be in (0, 1], got {spec.mfu}")
    return Sweep(spec, path, sha, base, size_specs, size_resources)


#: keys a grid may not move: the sweep's own axes, and what names a run (rrtrain.config: `axis`, `setting`)
GRID_FORBIDDEN = keys_a_grid_may_not_move()


def parse_grid(data: Any, where: str) -> dict[str, list]:
    """`{train.lr: [1e-3, 3e-3]}` (dotted or nested) -> {dotted key: values}: each a non-empty list of distinct
    scalars. The values' types are checked against the training config when the sweep is expanded."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a mapping of training keys to lists of values, got {data!r}")
    out: dict[str, list] = {}
    for key, values in dotted_keys(data).items():
        if key in GRID_FORBIDDEN:
            raise UsageError(f"{where}.{key}: {key} is an axis of the sweep (or names its runs): "
                             "it cannot be a grid key")
        if not isinstance(values, list) or not values:
            raise UsageError(f"{where}.{key}: expected a non-empty list of values, got {values!r}")
        for v in values:
            if not isinstance(v, (str, int, float, bool)):
                raise UsageError(f"{where}.{key}: grid values must be numbers, strings or booleans, got {v!r}")
        if len({repr(v) for v in values}) != len(values):
            raise UsageError(f"{where}.{key}: a value is listed twice: {values}")
        out[key] = list(values)
    return out


def parse_variant_grid(data: Any, spec: SweepSpec) -> dict[str, dict[str, list]]:
    """`variant_grid: {VARIANT: {key: values}}`: a variant's own grid (over the sweep's and the size's, per key)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"variant_grid: expected a mapping of variants to grids, got {data!r}")
    every = set(spec.variants) | {v for body in spec.sizes.values() if isinstance(body, dict)
                                  for v in (body.get("variants") or [])}
    out = {}
    for variant, grid in data.items():
        if str(variant) not in every:
            raise UsageError(f"variant_grid: '{variant}' is not a variant of this sweep ({', '.join(sorted(every))})")
        out[str(variant)] = parse_grid(grid, f"variant_grid.{variant}")
    return out


def check_variants(names: list, where: str) -> None:
    """Refuse a residual rule that does not exist, naming the closest one."""
    from rrtrain.resolve import check_rule  # the registry loads torch: only when a sweep file is read

    for v in names:
        check_rule(str(v), where)


def _find_config(sweep_path: Path, name: str) -> Path:
    from rrtrain.sizing import configs_dir

    for cand in (sweep_path.parent / name, configs_dir() / "train" / name):
        if cand.is_file():
            return cand.resolve()
    raise UsageError(f"config: no training config '{name}' beside {sweep_path.name} or in configs/train/")


def check_resources(r: Resources, where: str) -> None:
    """Refuse what no scheduler grants: zero nodes, negative GPUs, no time, tasks that do not fit the GPUs."""
    for key in ("nodes", "cpus_per_task", "time_min", "array_parallelism"):
        if getattr(r, key) < 1:
            raise UsageError(f"{where}.{key} must be at least 1, got {getattr(r, key)}")
    for key in ("gpus_per_node", "max_requeues", "signal_delay_s"):
        if getattr(r, key) < 0:
            raise UsageError(f"{where}.{key} must not be negative, got {getattr(r, key)}")
    if r.mem_gb <= 0:
        raise UsageError(f"{where}.mem_gb must be positive, got {r.mem_gb}")
    if r.tasks_per_node is not None and r.tasks_per_node < 1:
        raise UsageError(f"{where}.tasks_per_node must be at least 1, got {r.tasks_per_node}")
    if r.gpus_per_node and r.tasks_per_node is not None and r.tasks_per_node != r.gpus_per_node:
        raise UsageError(f"{where}: tasks_per_node={r.tasks_per_node} but gpus_per_node={r.gpus_per_node}: "
                         "runs take one task per GPU")
    if r.signal_delay_s >= r.time_min * 60:
        raise UsageError(f"{where}.signal_delay_s={r.signal_delay_s} is not shorter than time_min={r.time_min} min: "
                         "the warning would come before the run starts")
    for extra in r.extra_sbatch:
        if not isinstance(extra, str) or not extra.startswith("-") or "\n" in extra:
            raise UsageError(f"{where}.extra_sbatch: {extra!r} is not one sbatch option such as '--exclusive'")


def parse_prune(raw: Any) -> Optional[PruneSpec]:
    """The sweep file's `prune:` block, validated (None: no pruning). Built on its own, so that an unknown key
    in it is named with its closest valid one."""
    if raw is None:
        return None
    p: PruneSpec = build(PruneSpec, raw, "prune")
    check_prune(p)
    return p


def check_prune(p: PruneSpec) -> None:
    """Refuse a `prune:` block that cannot rank anything: no rungs, rungs that are neither fractions of the
    budget in (0, 1) nor step counts, rungs that do not rise, a keep fraction outside (0, 1], an unknown metric."""
    if not isinstance(p.rungs, list) or not p.rungs:
        raise UsageError(f"prune.rungs must list at least one rung (fractions of each run's steps, e.g. [0.25, 0.5], "
                         f"or step counts), got {p.rungs!r}")
    for r in p.rungs:
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise UsageError(f"prune.rungs: {r!r} is not a number (a fraction of the budget such as 0.25, or a step)")
        if isinstance(r, float) and not 0 < r < 1:
            raise UsageError(f"prune.rungs: {r} is not a fraction of the budget in (0, 1) (write a step count as an "
                             "integer, e.g. 100)")
        if isinstance(r, int) and r < 1:
            raise UsageError(f"prune.rungs: step {r} must be at least 1")
    if len({type(r) for r in p.rungs}) > 1:
        raise UsageError(f"prune.rungs: {p.rungs} mixes fractions and step counts: use one kind")
    if any(b <= a for a, b in zip(p.rungs, p.rungs[1:])):
        raise UsageError(f"prune.rungs must rise strictly, got {p.rungs}")
    if isinstance(p.keep, bool) or not isinstance(p.keep, (int, float)) or not 0 < p.keep <= 1:
        raise UsageError(f"prune.keep must be a fraction in (0, 1] (of a group's points kept at each rung), "
                         f"got {p.keep!r}")
    if p.metric not in PRUNE_METRICS:
        close = difflib.get_close_matches(str(p.metric), PRUNE_METRICS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(f"prune.metric: unknown metric '{p.metric}'{hint}; known: {', '.join(PRUNE_METRICS)}")
    if p.smooth is not None and (isinstance(p.smooth, bool) or p.smooth < 1):
        raise UsageError(f"prune.smooth must be at least 1 (values averaged up to a rung), got {p.smooth!r}")

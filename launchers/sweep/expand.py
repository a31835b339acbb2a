"""A sweep file -> its runs: one per (size, variant, grid point, seed), each a fully resolved, validated training
config.

A run's id is `SIZE-VARIANT-sSEED`, or `SIZE-VARIANT-POINT-sSEED` in a sweep with a `grid:` (POINT encodes the
setting, `lr3e-3`: `rrtrain.rundir.points`), and its directory `SWEEP_DIR/<id>`. Overrides apply in this order:
the base training config, the sweep's `overrides`, the size's `overrides`, the axes (size, variant, seed,
budget, matching, data, run dir), the grid point, then the run's own entry under `runs:` (which may move
neither an axis nor a grid key). With `log.wandb` set, a run's `log.wandb.group` defaults to the sweep
directory's name.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from launchers.sweep.spec import Resources, Sweep
from rrtrain.config import Config, sweep_axes, validate
from rrtrain.config_load import build, dotted_keys, read_yaml
from rrtrain.core.errors import UsageError
from rrtrain.rundir.points import point_key

if TYPE_CHECKING:  # the resolver loads torch (the registry); `rrtrain status` reads `Run` without it
    from rrtrain.resolve import ResolvedRun

#: characters allowed in names and paths that end up in shell scripts (they are quoted as well)
SAFE = re.compile(r"[A-Za-z0-9._+/@:=,-]+")  # in full (fullmatch): `$` would also match before a final newline
AXES = sweep_axes()  # the keys a sweep expands (rrtrain.config: `axis` on the field)


@dataclass(frozen=True)
class Run:
    id: str
    size: str
    variant: str
    seed: int
    config: dict  # the resolved Config as plain data (Config.to_dict())
    resources: Resources
    #: the run resolved as the trainer will (rule, matched shape, counts, budget; the dataset's manifest when it is
    #: prepared already): what the sweep's estimates and `rrtrain plan` read. None for a run read back from a record
    resolved: Optional["ResolvedRun"] = field(default=None, compare=False, repr=False)
    #: the grid point (training key -> value, typed as the config types it); {} in a sweep without a grid
    point: dict = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return Path(self.config["run"]["dir"])


def run_id(size: str, variant: str, seed: int, point: Optional[dict] = None) -> str:
    """`SIZE-VARIANT-sSEED`; with a grid point, `SIZE-VARIANT-POINT-sSEED` (`tiny-review-lr3e-3-s0`)."""
    key = point_key(point or {})
    return f"{size}-{variant}-{key}-s{seed}" if key else f"{size}-{variant}-s{seed}"


def grid_of(sweep: Sweep, size: str, variant: str) -> dict[str, list]:
    """The grid of one (size, variant): the sweep's, the size's and the variant's, the most specific per key."""
    return {**sweep.spec.grid, **sweep.size_specs[size].grid, **sweep.spec.variant_grid.get(variant, {})}


def typed_grid(grid: dict[str, list], base: dict) -> dict[str, list]:
    """Each value as the training config types its key (`"3e-3"` -> 0.003 for `train.lr`); a value the
    config would refuse (as `rrtrain train` refuses a `key=value` override) is refused here, naming it."""
    from rrtrain.resolve import build_config  # types a rule's knob (model.residual.*); the registry loads torch

    out: dict[str, list] = {}
    for key, values in grid.items():
        typed = []
        for value in values:
            data = copy.deepcopy(base)
            set_key(data, key, value)
            try:
                cfg = build_config(data)
            except UsageError as err:
                raise UsageError(f"grid {key}: value {value!r}: {err}") from None
            got = _dig_dotted(cfg.to_dict(), key)
            typed.append(got)
        if len({repr(v) for v in typed}) != len(typed):
            raise UsageError(f"grid {key}: two values are the same {values}")
        out[key] = typed
    return out


def _dig_dotted(data: dict, dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node[part]
    return node


def points(grid: dict[str, list]) -> list[dict[str, Any]]:
    """Every point of a grid, keys sorted, values in file order; [{}] for no grid."""
    keys = sorted(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def check_safe(text: str, what: str) -> str:
    """Refuse a name or path that could break (or inject into) a shell script."""
    if not SAFE.fullmatch(text):
        bad = sorted({c for c in text if not SAFE.fullmatch(c)})
        raise UsageError(f"{what} {text!r} has characters that are unsafe in a job script ({''.join(bad)!r}); "
                         "use letters, digits and ._+/@:=,-")
    return text


def set_key(data: dict, dotted: str, value: Any) -> None:
    """Set `a.b.c` in nested plain data, creating mappings on the way."""
    parts = dotted.split(".")
    if not all(parts):
        raise UsageError(f"override key {dotted!r} has an empty part")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def expand(sweep: Sweep, out: Path, data_path: Optional[Path]) -> list[Run]:
    """Every run of the sweep, in file order (size, then variant, then seed)."""
    # imported here: they load torch (the registry, the device mesh), which `rrtrain status` and the other
    # readers of this module's `Run` never need
    from rrtrain.data.manifest import prepared_manifest
    from rrtrain.parallel.mesh import mesh_shape
    from rrtrain.resolve import resolve

    spec = sweep.spec
    out = Path(out).resolve()
    check_safe(str(out), "sweep directory")
    check_safe(spec.name, "sweep name")
    base = read_yaml(sweep.base_config)
    prep_seq_len = spec.prep.seq_len if spec.prep is not None else None  # the data this sweep will prepare
    prep_vocab = prep_vocab_size(spec.prep)
    grids = {(size, v): points(typed_grid(grid_of(sweep, size, v), base))
             for size in sweep.size_specs for v in size_variants(sweep, size)}
    ids: dict[str, tuple] = {}
    for (size, v), pts in grids.items():
        for pt in pts:
            for seed in range(sweep.size_specs[size].seeds):
                rid = run_id(size, v, seed, pt)
                if rid in ids:
                    raise UsageError(f"grid: two runs would both be named '{rid}' ({_label(ids[rid])} and "
                                     f"{_label((size, v, pt, seed))}): rename a size or variant, or drop a value")
                ids[rid] = (size, v, pt, seed)
    gridded = {k for (size, v) in grids for k in grid_of(sweep, size, v)}
    for rid, over in spec.runs.items():
        if rid not in ids:
            close = difflib.get_close_matches(rid, sorted(ids), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"runs: no run '{rid}' in this sweep{hint}")
        moved = [k for k in over if k in AXES]
        if moved:
            raise UsageError(f"runs.{rid}: {moved[0]} is an axis of the sweep and cannot be overridden per run")
        regrid = [k for k in over if k in gridded]
        if regrid:
            raise UsageError(f"runs.{rid}: {regrid[0]} is a grid key of the sweep and cannot be overridden per run")
    runs: list[Run] = []
    for size, s in sweep.size_specs.items():
        for variant in size_variants(sweep, size):
            for point, seed in itertools.product(grids[(size, variant)], range(s.seeds)):
                rid = check_safe(run_id(size, variant, seed, point), "run name")
                data = copy.deepcopy(base)
                for key, value in {**spec.overrides, **s.overrides}.items():
                    set_key(data, key, value)
                set_key(data, "model.size", size)
                set_key(data, "model.variant", variant)
                set_key(data, "train.seed", seed)
                set_key(data, "run.dir", str(out / rid))
                set_key(data, "run.name", rid)
                if spec.match:
                    set_key(data, "match.reference", spec.match)
                if s.tokens is not None:
                    set_key(data, "train.tokens", s.tokens)
                if data_path is not None:
                    set_key(data, "data.path", str(data_path))
                for key, value in point.items():
                    set_key(data, key, value)
                if point:
                    set_key(data, "run.point", dict(point))
                for key, value in spec.runs.get(rid, {}).items():
                    set_key(data, key, value)
                wandb = data["log"].get("wandb") if isinstance(data.get("log"), dict) else None
                if isinstance(wandb, dict) and wandb.get("group") is None:  # one W&B group per sweep
                    set_key(data, "log.wandb.group", out.name)
                try:
                    cfg = build(Config, data)
                    validate(cfg)
                    manifest = prepared_manifest(cfg.data.path)
                    resolved = resolve(estimate_config(cfg, manifest, prep_vocab), manifest, seq_len=prep_seq_len)
                    if cfg.parallel.backend == "fsdp":  # the mesh must cover the run's ranks, as the trainer checks
                        mesh_shape(cfg.parallel, sweep.size_resources[size].world_size)
                except UsageError as err:
                    raise UsageError(f"run {rid}: {err}") from None
                if cfg.data.path is None:
                    raise UsageError(f"run {rid}: no data: set 'data' or 'prep' in the sweep file")
                if resolved.budget is None:
                    raise UsageError(f"run {rid}: no budget: set sizes.{size}.tokens or train.max_steps")
                runs.append(Run(rid, size, variant, seed, cfg.to_dict(), sweep.size_resources[size], resolved,
                                dict(point)))
    return runs


def prep_vocab_size(prep: Any) -> Optional[int]:
    """The vocabulary the sweep's own `prep:` will give (`data_prep.tokenizer.vocab_estimate`), None without one."""
    if prep is None:
        return None
    from data_prep.tokenizer import vocab_estimate

    return vocab_estimate(prep.tokenizer)


def estimate_config(cfg: Config, manifest: Optional[dict], prep_vocab: Optional[int]) -> Config:
    """The config the run is sized with before it trains: as the trainer will size it, at the data's vocabulary
    (the manifest's, read by `resolve`; before the sweep's `prep:` has run, the vocabulary its tokenizer gives)
    rather than the preset's 50,257. The run's recorded config leaves `model.vocab_size` to the data."""
    if manifest is not None or prep_vocab is None or cfg.model.vocab_size is not None:
        return cfg
    import dataclasses

    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=prep_vocab))


def _label(where: tuple) -> str:
    from rrtrain.rundir.points import point_label

    size, variant, point, seed = where
    return f"{size} {variant} {point_label(point)} seed {seed}"


def size_variants(sweep: Sweep, size: str) -> list[str]:
    """The residual rules run at one size: the size's own `variants`, else the sweep's."""
    own = sweep.size_specs[size].variants
    return list(own) if own is not None else list(sweep.spec.variants)


def data_path(sweep: Sweep, out: Path) -> Optional[Path]:
    """Where the runs read their data: the sweep's own prepared copy, or `data` relative to the sweep file."""
    if sweep.spec.prep is not None:
        return Path(out).resolve() / "data"
    if sweep.spec.data is None:
        return None
    p = Path(sweep.spec.data).expanduser()
    return p if p.is_absolute() else (sweep.path.parent / p).resolve()


def config_diff(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every key whose value differs."""
    a, b = dotted_keys(old), dotted_keys(new)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]

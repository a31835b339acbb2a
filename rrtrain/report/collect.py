"""Find the runs under a sweep directory and read them into the report's view, tolerating partial and corrupt
files: the files are found and read by `rrtrain.rundir` (`layout.run_dirs`, `readers`), which says what it could
not use in `Run.problems`.

A run directory is any directory holding `final.json` or `metrics.jsonl`
at any depth (`rrtrain.rundir.layout`). `final.json` is written once, when a run ends for any reason; a directory
with `metrics.jsonl` and no `final.json` is a run still going (or one that died without a word).

Each run is read once and reduced at once (`RunMetrics.of`): what the analysis and the plots use of its
metrics.jsonl (counts, the last training point, the spike score of the whole training curve, and the curves cut
to at most `curves.MAX_CURVE_POINTS` points each); its full series is dropped before the next run is read, so
the report's memory grows with the number of runs by a bounded amount each, whatever their length.

Nothing here decides what goes into a mean: `Run.category` only sorts runs into ok / flagged /
unfinished / unusable, and `rrtrain.report.analysis` applies `--include-flagged`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rrtrain.report.curves import downsample
from rrtrain.report.spikes import SpikeScore, spike_score
from rrtrain.rundir import downstream, fields, layout, readers
from rrtrain.rundir.layout import run_dirs
from rrtrain.rundir.points import read_point

FLAGGED_STATUSES = frozenset({"stalled", "diverged", "failed"})
"""Statuses that mark a run as flagged: listed separately, kept out of means by default."""

UNFINISHED_STATUSES = frozenset({"preempted", "running"})
"""Statuses of runs that have not reached the end of their schedule; listed, never averaged."""

PRUNED_STATUSES = frozenset({"pruned", "paused"})
"""Runs a pruned sweep stopped at a rung (successive halving): listed, never averaged, whatever the options."""

KNOWN_STATUSES = FLAGGED_STATUSES | UNFINISHED_STATUSES | PRUNED_STATUSES | {"completed"}

TRAIN_KINDS = frozenset({"train"})
#: a mixture's per-source validation losses in an evaluation line: `val/<name>`
SOURCE_PREFIX = "val/"
EVAL_KINDS = frozenset({"eval", "val"})


@dataclass
class Metrics:
    """The loss curves of one run, one value per step (the last one logged for a step wins)."""

    train_steps: np.ndarray
    train_loss: np.ndarray
    val_steps: np.ndarray
    val_loss: np.ndarray
    lines: int = 0
    bad_lines: int = 0
    relogged: int = 0
    #: the in-loop downstream values of the largest step that has any ({step: {"TASK/METRIC": value}}, one step)
    downstream: downstream.Table = field(default_factory=dict)
    #: a mixture's validation loss per source (`val/<name>`) at the largest step that has any, and that step
    val_sources: dict[str, float] = field(default_factory=dict)
    val_sources_step: int | None = None

    @classmethod
    def empty(cls) -> "Metrics":
        z = np.zeros(0)
        return cls(z.astype(int), z, z.astype(int), z)


def seed_int(seed: object) -> int | None:
    """A run's seed as a number, None where its config.yaml held something else (anyone may have written it)."""
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


@dataclass
class RunMetrics:
    """What the report keeps of one run's metrics.jsonl: the plotted curves (at most `MAX_CURVE_POINTS` points
    each, `curves.downsample`), and what was computed on the whole series before it was dropped."""

    train_steps: np.ndarray
    train_loss: np.ndarray
    val_steps: np.ndarray
    val_loss: np.ndarray
    train_points: int = 0  # training steps logged (the whole curve)
    val_points: int = 0
    last_train_step: int | None = None
    last_train_loss: float | None = None
    spike: SpikeScore | None = None  # of the whole training curve; None when it has no point
    lines: int = 0
    bad_lines: int = 0
    relogged: int = 0
    val_sources: dict[str, float] = field(default_factory=dict)  # a mixture's last `val/<name>` values
    val_sources_step: int | None = None

    @classmethod
    def of(cls, m: Metrics) -> "RunMetrics":
        ts, tl = downsample(m.train_steps, m.train_loss)
        vs, vl = downsample(m.val_steps, m.val_loss)
        n = len(m.train_loss)
        return cls(ts, tl, vs, vl, train_points=n, val_points=len(m.val_loss),
                   last_train_step=int(m.train_steps[-1]) if n else None,
                   last_train_loss=float(m.train_loss[-1]) if n else None,
                   spike=spike_score(m.train_loss) if n else None,
                   lines=m.lines, bad_lines=m.bad_lines, relogged=m.relogged, val_sources=m.val_sources,
                   val_sources_step=m.val_sources_step)

    @classmethod
    def empty(cls) -> "RunMetrics":
        return cls.of(Metrics.empty())


@dataclass
class Run:
    """One run directory, as read from disk."""

    path: Path
    rel: str
    variant: str | None = None
    size: str | None = None
    seed: int | str | None = None
    status: str = "unfinished"
    flags: tuple[str, ...] = ()
    has_final: bool = False
    params: float | None = None
    step: int | None = None
    tokens: int | None = None
    final_val_loss: float | None = None
    best_val_loss: float | None = None
    wall_s: float | None = None
    metrics: RunMetrics = field(default_factory=RunMetrics.empty)
    problems: list[str] = field(default_factory=list)
    final_error: str | None = None  # why final.json could not be used at all
    point: dict = field(default_factory=dict)  # the grid point (config.yaml `run.point`); {} without a grid
    #: the final downstream values (`rrtrain.rundir.downstream.final`: the largest step that has any), and that step
    downstream: dict[str, float] = field(default_factory=dict)
    downstream_step: int | None = None
    #: a cooldown branch's parent (config.yaml `train.branch_from`): its run directory and the step branched at
    branch_from: tuple[str, int] | None = None
    #: config.yaml's `model.parametrization` ("sp" where it records none), and the model's width and depth
    #: (`model.d_model`, `model.n_layers`, else its size preset's; None where neither says)
    parametrization: str = "sp"
    width: int | None = None
    depth: int | None = None

    @property
    def category(self) -> str:
        """`ok`, `flagged`, `unfinished` or `unusable`; see `reason` for why a run is not ok."""
        return self._classify()[0]

    @property
    def reason(self) -> str:
        return self._classify()[1]

    def _classify(self) -> tuple[str, str]:
        if self.final_error is not None:
            return "unusable", self.final_error
        if self.variant is None or self.size is None:
            return "unusable", "variant or size unknown (no readable final.json or config.yaml)"
        if not self.has_final:
            return "unfinished", "no final.json yet (running or unfinished)"
        if self.status in PRUNED_STATUSES:  # before the flags: --include-flagged never brings one into a mean
            return "unfinished", f"status {self.status} (stopped at a rung of the sweep's pruning)"
        if self.status in FLAGGED_STATUSES or self.flags:
            why = [f"status {self.status}"] if self.status in FLAGGED_STATUSES else []
            if self.flags:
                why.append("flags: " + ", ".join(self.flags))
            return "flagged", "; ".join(why)
        if self.status in UNFINISHED_STATUSES:
            return "unfinished", f"status {self.status}"
        if self.status not in KNOWN_STATUSES:
            return "unusable", f"unknown status {self.status!r}"
        if self.final_val_loss is None:
            return "unusable", "no final_val_loss"
        return "ok", ""

    @property
    def convex(self) -> bool:
        return is_convex(self.variant or "")


def is_convex(variant: str) -> bool:
    """Convex-gate variants (the residual registry's `convex` rules) are drawn dashed; a name the registry
    does not know (a run from another version) is not convex."""
    from rrtrain import residuals

    try:
        return residuals.get(variant).convex
    except KeyError:
        return False


def find_runs(sweep_dir: str | os.PathLike[str], skip: list[Path] | None = None) -> list[Run]:
    """Every run directory under `sweep_dir` (any depth), read and sorted by relative path.

    `skip` lists directories not to search (the report's own output directory).
    """
    root = Path(sweep_dir)
    return sorted((read_run(d, root) for d in run_dirs(root, skip)), key=lambda r: r.rel)


def read_run(run_dir: Path, root: Path) -> Run:
    """Read one run directory: final.json, then config.yaml for what final.json lacks, then metrics."""
    rel = run_dir.relative_to(root).as_posix() if run_dir != root else "."
    run = Run(path=run_dir, rel=rel)
    unreadable: list[str] = []
    final = readers.read_final(run_dir, unreadable)
    if unreadable:
        run.final_error = unreadable[0]
        run.problems.extend(unreadable)
    config = {} if readers.has_identity(final) else readers.read_config(run_dir, run.problems)
    if final is not None:
        run.has_final = True
        run.problems.extend(final.problems)
        run.status = final.status or "unknown"
        run.flags = final.flags
        run.params, run.step, run.tokens, run.wall_s = final.params, final.step, final.tokens, final.wall_s
        run.final_val_loss, run.best_val_loss = final.final_val_loss, final.best_val_loss
    who = readers.identity(final, config)
    config = config if config else readers.read_config(run_dir)
    run.point = read_point(config)
    run.branch_from = read_branch(config)
    run.variant, run.size, run.seed = who.variant, who.size, who.seed
    run.parametrization, run.width, run.depth = read_shape(config, run.size)
    metrics = readers.metrics_path(run_dir)
    records: downstream.Table = {}
    if metrics.is_file():
        m = read_metrics(metrics)
        records = m.downstream
        run.metrics = RunMetrics.of(m)  # the full series goes out of scope here
        if run.metrics.bad_lines:
            run.problems.append(f"{layout.METRICS}: {run.metrics.bad_lines} unreadable line(s) skipped")
    files = downstream.read_eval_dir(run_dir, run.problems)
    if records or files:
        run.downstream_step, run.downstream = downstream.final(downstream.merge(records, files))
    return run


def read_shape(config: dict, size: str | None) -> tuple[str, int | None, int | None]:
    """A recorded config's parametrization, width and depth, as untrusted data: no parametrization is sp (a run from
    before it existed), one rrtrain does not know is "unknown"; a width or depth that is not a positive integer
    reads as the size preset's (None for an unknown preset)."""
    from rrtrain.model.parametrization import PARAMETRIZATIONS
    from rrtrain.sizing import presets

    raw = fields.dig(config, "model", "parametrization")
    param = "sp" if raw is None else raw if raw in PARAMETRIZATIONS else "unknown"
    preset = presets().get(size) if isinstance(size, str) else None

    def dim(key: str) -> int | None:
        n = fields.count(fields.dig(config, "model", key))
        return n if n else (getattr(preset, key) if preset is not None else None)

    return param, dim("d_model"), dim("n_layers")


def read_branch(config: dict) -> tuple[str, int] | None:
    """The parent a run branched from (`train.branch_from`, `RUN_DIR@STEP` as the trainer recorded it), as
    untrusted data: None when absent or malformed."""
    raw = fields.dig(config, "train", "branch_from")
    if not isinstance(raw, str):
        return None
    parent, _, step = raw.rpartition("@")
    if not parent or not step.isdigit() or len(step) > 18:
        return None
    return parent, int(step)


def read_metrics(path: Path) -> Metrics:
    """Parse metrics.jsonl: training lines (`step`, `loss`) and evaluation lines (`step`, `val_loss`).

    Downstream lines (`"kind": "downstream"`) keep only the values of their largest step (`downstream`: the run's
    final downstream values are reported, `rrtrain.rundir.downstream`); lines with another `kind` (e.g. `"diag"`)
    are ignored. Lines that are not JSON objects (a torn
    last line after a crash, garbage) are counted in `bad_lines` and skipped, and so are lines whose loss has
    no step or is not a loss (`rrtrain.rundir.fields.loss`). A step logged twice (a resumed run re-logs the steps after its last checkpoint)
    keeps the last value; `relogged` counts the replaced values. A mixture's evaluation lines also carry
    `val/<name>` per source: those of the largest step that has any are kept (`val_sources`).
    """
    train: dict[int, float] = {}
    val: dict[int, float] = {}
    down: downstream.Table = {}
    per_source: dict[str, float] = {}
    per_source_step: int | None = None
    lines = bad = relogged = 0
    for rec in readers.records(path):
        lines += 1
        if rec is None:
            bad += 1
            continue
        kind = rec.get("kind")
        if kind == downstream.KIND:
            downstream.take_record(rec, down)
            downstream.keep_last(down)  # only the final values are reported
            continue
        if kind is not None and (not isinstance(kind, str) or kind not in TRAIN_KINDS | EVAL_KINDS):
            continue  # another kind of line (a list as kind is not hashable: not a kind at all)
        step = fields.count(rec.get("step"))
        malformed = False
        for key, table in (("loss", train), ("val_loss", val)):
            value = rec.get(key)
            if value is None or (key == "loss" and kind in EVAL_KINDS):
                continue
            x = fields.number(value)  # NaN stays (a diverged step); a finite value must be a loss
            loss = x if x is not None and not math.isfinite(x) else fields.loss(value)
            if step is None or loss is None:
                malformed = True  # no step, or not a loss (a string, 1e308, a negative number)
                continue
            relogged += step in table
            table[step] = loss
        if step is not None and rec.get("val_loss") is not None and kind in (None, *EVAL_KINDS):
            found = {k[len(SOURCE_PREFIX):]: fields.loss(v) for k, v in rec.items()
                     if isinstance(k, str) and k.startswith(SOURCE_PREFIX)}
            found = {k: v for k, v in found.items() if v is not None and k}
            if found and (per_source_step is None or step >= per_source_step):
                per_source, per_source_step = found, step
        bad += malformed
    ts = sorted(train)
    vs = sorted(val)
    return Metrics(
        train_steps=np.array(ts, dtype=np.int64),
        train_loss=np.array([train[s] for s in ts], dtype=float),
        val_steps=np.array(vs, dtype=np.int64),
        val_loss=np.array([val[s] for s in vs], dtype=float),
        lines=lines,
        bad_lines=bad,
        relogged=relogged,
        downstream=down,
        val_sources=per_source,
        val_sources_step=per_source_step,
    )

"""Sweep-level flags, computed from every run's files, so runs from any source (older rrtrain, other tools
writing the same files) are judged alike.

- `no_heartbeat`: a run without `final.json` whose `metrics.jsonl` has not grown for `monitor.heartbeat_s`
  (the caller keeps this for runs whose job the scheduler says is running);
- `lagging`: the run's recent loss is above the median of its peers (same size, other variants and seeds, at
  the same tokens seen) by `monitor.peer_mad` median absolute deviations;
- `early_stall`: the in-run plateau test (`rrtrain.monitoring.convergence.LossMonitor`) run on the file's training losses.

The in-run flags a run recorded (`final.json` `flags`, flag lines in `metrics.jsonl`) are carried along.
Each run is judged under the thresholds it trained with (the `monitor` section of its `config.yaml`: a sweep may
set them per size or per run); the caller's thresholds serve runs without one.
Only the tail of a big `metrics.jsonl` is read (`tail_bytes`). `to_cancel` says which runs' jobs to cancel.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from launchers.sweep.record import SweepRecord
from rrtrain.config import MonitorConfig, validate_monitor
from rrtrain.config_load import build
from rrtrain.core.errors import UsageError
from rrtrain.monitoring.convergence import DIVERGED, STALLED, LossMonitor, smoothing_span
from rrtrain.rundir import fields, readers
from rrtrain.rundir.layout import run_dirs

NO_HEARTBEAT, LAGGING, EARLY_STALL = "no_heartbeat", "lagging", "early_stall"
CANCEL_FLAGS = frozenset({STALLED, DIVERGED, EARLY_STALL})
TAIL_BYTES = 1 << 20  # about 6,000 training lines
STALL_RECORDS = 3  # early_stall replays the last 3 windows of training lines


@dataclass
class RunVerdict:
    """One run as the sweep sees it: identity, progress and every flag (name -> why)."""

    path: Path
    rel: str
    size: Optional[str]
    variant: Optional[str]
    seed: Any
    status: str  # final.json's status ("unknown" when it names none), or "running" when there is none
    step: Optional[int] = None
    tokens: Optional[int] = None
    loss: Optional[float] = None  # the mean of the last few training losses
    flags: dict[str, str] = field(default_factory=dict)
    monitor: Optional[MonitorConfig] = None  # the thresholds of the run's own config.yaml, when it has them
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)  # training lines from the tail
    _index: Optional[tuple[list[int], list[float]]] = field(default=None, repr=False)  # loss_at's lookup


def read_run(path: Path, root: Path, tail_bytes: int = TAIL_BYTES) -> RunVerdict:
    final, config = readers.read_final(path), readers.read_config(path)
    who = readers.identity(final, config)
    status = "running" if final is None else final.status or "unknown"  # a final.json: the run has ended
    verdict = RunVerdict(path=path, rel=path.relative_to(root).as_posix() if path != root else ".",
                         size=who.size, variant=who.variant, seed=who.seed, status=status, monitor=monitor_of(config))
    last: dict[int, dict[str, Any]] = {}
    for rec in readers.read_tail(readers.metrics_path(path), tail_bytes):
        step = fields.step(rec.get("step"))
        if rec.get("kind") == "flag":
            verdict.flags.setdefault(str(rec.get("flag")), f"raised in the run at step {rec.get('step')}")
        elif rec.get("kind") is None and step is not None and _finite(rec.get("loss")):
            # a resumed run re-logs steps: the last line wins; a step written as 7.0 is stored as 7
            last[step] = rec if type(rec["step"]) is int else {**rec, "step": step}
    verdict.records = [last[s] for s in sorted(last)]
    if final is not None:
        for name in final.flags:
            verdict.flags.setdefault(name, final.flag_details.get(name, "in final.json"))
    if verdict.records:
        verdict.step, verdict.tokens = verdict.records[-1]["step"], fields.integer(verdict.records[-1].get("tokens"))
        verdict.loss = _recent_loss(verdict.records)
    return verdict


def monitor_of(config: dict[str, Any]) -> Optional[MonitorConfig]:
    """The `monitor` section of a resolved run config as thresholds; None when it has none or one this rrtrain
    cannot read (another tool's, another version's): such a run is judged under the caller's thresholds."""
    section = config.get("monitor")
    if not isinstance(section, dict):
        return None
    try:
        mon = build(MonitorConfig, section, "monitor")
        validate_monitor(mon)  # a window of 0 or -1 from a file is as unusable as a string
        return mon
    except UsageError:
        return None


def _finite(value: Any) -> bool:
    return fields.finite(value) is not None  # never math.isfinite on an int: 10**400 overflows


def _recent_loss(records: list[dict[str, Any]], n: int = 10) -> float:
    return statistics.fmean(r["loss"] for r in records[-n:])


def _entropy_and_warmup(path: Path) -> tuple[Optional[float], int]:
    """The run's training data's unigram entropy (from its manifest; a mixture's, the mean of its sources' weighted
    as in training, as the trainer's monitor takes it) and its warmup steps, where findable."""
    config = readers.read_config(path)
    entropies, weights = [], []
    for data_path, weight in fields.data_sources(config):
        entropy = ((readers.read_json_object(Path(data_path) / "manifest.json")) or {}).get("unigram_entropy")
        if not _finite(entropy):
            entropies = []
            break
        entropies.append(float(entropy))
        weights.append(weight)
    warmup = fields.dig(config, "train", "warmup_steps")
    mean = sum(e * w for e, w in zip(entropies, weights)) / sum(weights) if entropies else None
    return mean, (int(warmup) if isinstance(warmup, int) else 0)


def early_stall(verdict: RunVerdict, cfg: MonitorConfig) -> Optional[str]:
    """The in-run plateau test on the file's losses: why the run has stalled, or None."""
    entropy, warmup = _entropy_and_warmup(verdict.path)
    monitor = LossMonitor(cfg, entropy, start_step=warmup)
    for flag in monitor.feed(verdict.records[-STALL_RECORDS * cfg.window:]):  # the EMA settles well inside that
        if flag.name == STALLED:
            return f"at step {flag.step}: {flag.detail}"
    return None


def no_heartbeat(verdict: RunVerdict, cfg: MonitorConfig, now: float) -> Optional[str]:
    if verdict.status != "running":
        return None
    beat = readers.metrics_path(verdict.path)
    if not beat.exists():
        beat = verdict.path
    idle = now - beat.stat().st_mtime
    return f"no new step for {idle:.0f} s (limit {cfg.heartbeat_s:g} s)" if idle > cfg.heartbeat_s else None


def _loss_index(verdict: RunVerdict) -> tuple[list[int], list[float]]:
    """(tokens of each training record, running sums of their losses), built once per run: every peer asks."""
    if verdict._index is None:
        rows = [r for r in verdict.records if isinstance(r.get("tokens"), int)]
        verdict._index = ([r["tokens"] for r in rows], list(itertools.accumulate((r["loss"] for r in rows), initial=0.0)))
    return verdict._index


def loss_at(verdict: RunVerdict, tokens: int, n: int) -> Optional[float]:
    """The mean of the run's last `n` training losses at or before `tokens`, if its tail covers that point."""
    if verdict.tokens is None or verdict.tokens < tokens:
        return None
    seen, sums = _loss_index(verdict)
    end = bisect.bisect_right(seen, tokens)
    if end == 0:
        return None
    start = max(0, end - n)
    return (sums[end] - sums[start]) / (end - start)


def lagging(verdict: RunVerdict, peers: list[RunVerdict], cfg: MonitorConfig) -> Optional[str]:
    """Above the peers' median by `peer_mad` MADs at this run's tokens seen (needs at least two peers there)."""
    if verdict.tokens is None or not verdict.records:
        return None
    n = smoothing_span(cfg.window)
    own = loss_at(verdict, verdict.tokens, n)
    values = [v for v in (loss_at(p, verdict.tokens, n) for p in peers) if v is not None]
    if own is None or len(values) < 2:
        return None
    median = statistics.median(values)
    mad = max(statistics.median(abs(v - median) for v in values), 0.005 * abs(median))  # floor: identical peers
    if own > median + cfg.peer_mad * mad:
        return (f"loss {own:.4f} vs peers' median {median:.4f} (MAD {mad:.4f}, {len(values)} peers) "
                f"at {verdict.tokens:,} tokens")
    return None


def judge_sweep(sweep_dir: str | os.PathLike[str], cfg: Optional[MonitorConfig] = None, now: Optional[float] = None,
                tail_bytes: int = TAIL_BYTES, live_only: bool = False,
                reader: Optional[Callable[[Path, Path, int], RunVerdict]] = None) -> list[RunVerdict]:
    """Every run under `sweep_dir`, with its in-run flags and the sweep-level ones, sorted by path. `cfg`: the
    thresholds for runs whose config.yaml has no `monitor` section (every other run is judged under its own).
    `live_only`: judge only the runs still going (the ended ones keep the flags they recorded; `rrtrain status`).
    `reader`: reads one run (default `read_run`; `rrtrain status --watch` passes one that keeps unchanged runs)."""
    cfg, now = cfg or MonitorConfig(), time.time() if now is None else now
    root = Path(sweep_dir)
    runs = [(reader or read_run)(d, root, tail_bytes) for d in run_dirs(root)]
    by_size: dict[Any, list[RunVerdict]] = {}
    for run in runs:
        by_size.setdefault(run.size, []).append(run)
    for run in runs:
        if live_only and run.status != "running":
            continue
        peers = [p for p in by_size[run.size] if p is not run]
        own = run.monitor or cfg
        for name, why in ((NO_HEARTBEAT, no_heartbeat(run, own, now)), (LAGGING, lagging(run, peers, own)),
                          (EARLY_STALL, early_stall(run, own))):
            if why is not None:
                run.flags.setdefault(name, why)
    return runs


def to_cancel(verdicts: list[RunVerdict]) -> list[RunVerdict]:
    """Runs still going (no final.json) that carry a flag worth their job's cancellation: stalled,
    early_stall or diverged."""
    return [v for v in verdicts if v.status == "running" and CANCEL_FLAGS & set(v.flags)]


def monitor_config(rec: SweepRecord) -> MonitorConfig:
    """Thresholds for a run of the sweep whose directory has no config.yaml of its own (the first recorded run's
    resolved `monitor` section); every run with one is judged under its own (`launchers.state.flags`)."""
    for entry in rec.runs.values():
        found = monitor_of(entry.config)
        if found is not None:
            return found
    return MonitorConfig()

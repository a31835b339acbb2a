"""Sweep-level flags on synthetic run directories laid out like a sweep (launchers.state.flags)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import yaml

from rrtrain.config import MonitorConfig
from launchers.state.flags import EARLY_STALL, LAGGING, NO_HEARTBEAT, judge_sweep, to_cancel
from rrtrain.rundir.readers import read_tail

H = 3.1
TOKENS_PER_STEP = 512


def write_run(sweep: Path, data: Path, size: str, variant: str, seed: int, loss: np.ndarray,
              final: dict | None = None, extra: list[dict] | None = None) -> Path:
    run = sweep / f"{size}-{variant}-s{seed}"
    run.mkdir(parents=True)
    cfg = {"model": {"size": size, "variant": variant}, "train": {"seed": seed, "warmup_steps": 10},
           "data": {"path": str(data)}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = [{"step": s, "loss": float(v), "tokens": s * TOKENS_PER_STEP, "lr": 1e-3} for s, v in enumerate(loss, 1)]
    lines += extra or []
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if final is not None:
        (run / "final.json").write_text(json.dumps({"size": size, "variant": variant, "seed": seed, **final}))
    return run


def curve(steps: int, floor: float | np.ndarray, seed: int, tau: float = 40.0) -> np.ndarray:
    """A fall from ln(258) onto `floor` (a level or a curve), with noise."""
    t = np.arange(1, steps + 1)
    rng = np.random.default_rng(seed)
    return floor + (math.log(258) - floor) * np.exp(-t / tau) + rng.normal(0, 0.02, steps)


def descending(steps: int, seed: int) -> np.ndarray:
    """A healthy run: onto the entropy, then well below it."""
    t = np.arange(1, steps + 1)
    return curve(steps, H + 0.1 - 0.8 * (t / steps) ** 0.7, seed)


def make_sweep(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"unigram_entropy": H, "seq_len": 64}))
    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        write_run(sweep, data, "tiny", "review", seed, descending(600, seed))
    write_run(sweep, data, "tiny", "standard", 0, descending(600, 7))
    write_run(sweep, data, "tiny", "review_convex", 0, curve(600, H + 0.02, 3))
    quiet = write_run(sweep, data, "tiny", "standard", 1, descending(600, 8))
    old = time.time() - 4000
    os.utime(quiet / "metrics.jsonl", (old, old))
    write_run(sweep, data, "small", "review", 0, curve(600, H + 0.5, 4))  # alone at its size: no peers
    write_run(sweep, data, "tiny", "highway_convex", 0, curve(600, H, 5),
              final={"status": "stalled", "flags": ["stalled"], "flag_details": {"stalled": "plateau"}},
              extra=[{"kind": "flag", "step": 300, "flag": "stalled", "detail": "plateau"}])
    return sweep


def test_sweep_flags_on_files(tmp_path):
    sweep = make_sweep(tmp_path)
    verdicts = {v.rel: v for v in judge_sweep(sweep, MonitorConfig(heartbeat_s=1800))}
    flags = {rel: set(v.flags) for rel, v in verdicts.items()}
    assert flags["tiny-review-s0"] == set() and flags["tiny-review-s1"] == set()
    assert flags["tiny-standard-s0"] == set()
    assert flags["tiny-review_convex-s0"] == {EARLY_STALL, LAGGING}, verdicts["tiny-review_convex-s0"].flags
    assert flags["tiny-standard-s1"] == {NO_HEARTBEAT}
    assert EARLY_STALL in flags["small-review-s0"] and LAGGING not in flags["small-review-s0"]
    assert {"stalled", EARLY_STALL} <= flags["tiny-highway_convex-s0"]
    assert verdicts["tiny-highway_convex-s0"].status == "stalled"
    assert verdicts["tiny-review-s0"].step == 600 and verdicts["tiny-review-s0"].tokens == 600 * TOKENS_PER_STEP
    cancel = sorted(v.rel for v in to_cancel(list(verdicts.values())))
    assert cancel == ["small-review-s0", "tiny-review_convex-s0"]  # the stalled one has ended already


def test_only_the_tail_of_a_big_metrics_file_is_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 3.0}) + "\n" for s in range(1, 2001)) + '{"step": 20')
    tail = read_tail(path, tail_bytes=4096)
    steps = [r["step"] for r in tail]
    assert 0 < len(steps) < 200 and steps[-1] == 2000 and steps == list(range(steps[0], 2001))
    assert len(read_tail(path, tail_bytes=1 << 20)) == 2000


def test_a_stall_needs_the_entropy_from_the_manifest(tmp_path):
    sweep = make_sweep(tmp_path)
    (tmp_path / "data" / "manifest.json").unlink()
    verdicts = {v.rel: v for v in judge_sweep(sweep)}
    assert EARLY_STALL not in verdicts["tiny-review_convex-s0"].flags


def test_each_run_is_judged_under_its_own_thresholds(tmp_path):
    """A sweep may set monitor thresholds per size or per run: the same curve stalls under the strict thresholds
    of one run's config.yaml and not under another run's defaults, whatever the caller passes; a run whose
    monitor section this rrtrain cannot read is judged under the caller's."""
    sweep = make_sweep(tmp_path)
    slow = curve(600, H + 0.02, 3, tau=150.0)  # still falling at step 300, flat by 500
    strict = write_run(sweep, tmp_path / "data", "deep", "review", 0, slow[:300])
    default = write_run(sweep, tmp_path / "data", "deep", "standard", 0, slow[:300])
    foreign = write_run(sweep, tmp_path / "data", "deep", "highway", 0, slow[:300])
    for run, monitor in ((strict, {"min_steps": 60, "window": 20, "min_improvement": 0.5}), (default, {}),
                         (foreign, {"not_a_threshold": 1})):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "monitor": monitor}))
    for caller in (MonitorConfig(), MonitorConfig(min_steps=60, window=20, min_improvement=0.5)):
        flags = {v.rel: set(v.flags) for v in judge_sweep(sweep, caller)}
        assert EARLY_STALL in flags["deep-review-s0"], caller
        assert EARLY_STALL not in flags["deep-standard-s0"], caller
        assert (EARLY_STALL in flags["deep-highway-s0"]) == (caller.min_steps == 60), caller

"""`fixup` at 40 sublayers over the tiny config's whole schedule, seeds 0-4: the long form of
tests/unit/rrtrain/residuals/test_residuals_fixup.py::test_fixup_trains_at_40_sublayers (seed 0, 30 steps; it ran
seeds 0-4 for 30 steps before, 132 s of the suite), and the readout ablation that docs/depth.md tabulates.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_fixup_depth.py
(about 5 minutes on one free core: five 200-step runs, and five that stop within ~35 steps).

Each run is `rrtrain train configs/train/tiny.yaml model.variant=fixup model.n_layers=20 train.seed=S` on the
synthetic stories of the test suite (lr 3e-3, 20 warmup steps, 16 sequences of 64 bytes per step, 200 steps),
once with the papers' readout (the default) and once with `model.residual.fixup_final_norm=true`. The table
prints, per run, the outcome, the first step with a non-finite loss or gradient, and the held-out loss at steps
50/100/150/200. Asserted: every default run completes with no non-finite step and ends below the corpus's
unigram entropy by more than 0.7 nats (measured 2.13-2.17 against 3.12).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainutil import final, prep_stories, records, train

SEEDS = range(5)
RUN = ["model.variant=fixup", "model.n_layers=20", "train.log_every=1", "train.ckpt_every=0"]


def first_nonfinite(run: Path) -> str:
    for r in records(run):
        if "loss" in r and "val_loss" not in r:
            if r.get("skipped") or r.get("grad_norm") is None or not math.isfinite(r["loss"]):
                return str(r["step"])
    return "-"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prep_stories(tmp_path_factory.mktemp("data") / "stories")


def test_fixup_depth_40_sublayers_tiny_schedule(tmp_path, data):
    entropy = json.loads((data / "manifest.json").read_text())["unigram_entropy"]
    rows, failures = [], []
    for final_norm in ("false", "true"):
        for seed in SEEDS:
            run = tmp_path / f"fn{final_norm}_s{seed}"
            train(run, data, *RUN, f"train.seed={seed}", f"model.residual.fixup_final_norm={final_norm}",
                  expect=None, timeout=1200)
            done = final(run)
            val = {r["step"]: r["val_loss"] for r in records(run) if "val_loss" in r}
            rows.append(f"| {final_norm} | {seed} | {done['status']} (step {done['step']}) | {first_nonfinite(run)} | "
                        + " / ".join(f"{val[s]:.3f}" if s in val else "—" for s in (50, 100, 150, 200)) + " |")
            if final_norm == "false" and not (done["status"] == "completed" and done["nonfinite_skipped"] == 0
                                              and val.get(200, math.inf) < entropy - 0.7):
                failures.append((seed, done["status"], val))
    print(f"\nunigram entropy {entropy:.3f}\n| fixup_final_norm | seed | outcome | first non-finite | "
          "held-out at 50 / 100 / 150 / 200 |\n|---|---|---|---|---|")
    print("\n".join(rows))
    assert not failures, failures

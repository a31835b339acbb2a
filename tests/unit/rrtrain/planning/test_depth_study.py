"""The depth study (rrtrain/planning/depth_study.py): its verdicts, its data, and a real stall next to a real run
that trains, on CPU.

The paper's shapes need a GPU (tests/benchmarks/gpu_rules.sh); here the same code runs at width 32:
- the verdict logic on the curves docs/depth.md recorded at 40 sublayers (300 steps, default monitor);
- a real study at 20 sublayers of width 32 (byte vocabulary, 100 steps, lr 3e-3): the cheapest setting found
  where `review_convex` stalls and `review` trains within the test's budget (BPE vocabularies of 300-512
  needed more steps for `review` to leave the entropy plateau; 12 sublayers, or 80 steps, left `review` flagged
  or undecided); about 25 s of CPU in all;
- each learning rate of a (shape, rule) starting from restored weights trains exactly as from a fresh build.
"""

from __future__ import annotations

import json
import math
import random
import subprocess

import pytest

from rrtrain.config import MonitorConfig
from rrtrain.core.errors import UsageError
from rrtrain.monitoring.convergence import LossMonitor
from rrtrain.planning import depth_study
from rrtrain.planning.depth_data import story_rows
from rrtrain.planning.depth_verdict import grad_ratio, render, verdict
from trainutil import PY, REPO, env

ENTROPY = 3.117  # docs/depth.md: the byte-level synthetic stories of the test suite
#: docs/depth.md, "The convex gate at 40 sublayers, training": mean training loss of the 10 steps ending at each step
RECORDED = {
    "review_convex": [4.625, 3.342, 3.162, 3.114, 3.127, 3.119, 3.137, 3.110, 3.122, 3.131, 3.113, 3.111],
    "review": [4.204, 3.194, 2.931, 2.704, 2.626, 2.553, 2.570, 2.489, 2.486, 2.468, 2.444, 2.449],
}


def per_step(points: list[float], noise: float = 0.03, seed: int = 0) -> list[float]:
    """The recorded curve (a point every 25 steps, from 5.55 at step 0) as 300 per-step losses with noise."""
    rng = random.Random(seed)
    xs, ys = [0] + [25 * (i + 1) for i in range(len(points))], [5.55] + points
    out = []
    for step in range(1, 301):
        k = max(i for i, x in enumerate(xs) if x <= step) if step < 300 else len(xs) - 2
        f = (step - xs[k]) / (xs[k + 1] - xs[k])
        out.append(ys[k] + f * (ys[k + 1] - ys[k]) + rng.gauss(0, noise))
    return out


def judge(losses: list[float], entropy: float = ENTROPY, cfg: MonitorConfig = MonitorConfig(), warmup: int = 15):
    monitor = LossMonitor(cfg, entropy, start_step=warmup)
    for step, loss in enumerate(losses, 1):
        monitor.update({"step": step, "loss": loss})
    return verdict(losses, dict(monitor.raised), entropy, cfg.entropy_margin)


def test_verdicts_on_the_curves_docs_depth_recorded():
    convex, review = judge(per_step(RECORDED["review_convex"])), judge(per_step(RECORDED["review"]))
    assert convex["verdict"] == "stalled" and 200 <= convex["at_step"] <= 300, convex
    assert abs(convex["vs_entropy"]) < 0.05
    assert review["verdict"] == "trained" and review["at_step"] is None, review
    assert review["final_loss"] == pytest.approx(2.449, abs=0.03) and review["vs_entropy"] < -0.6


def test_verdicts_diverged_and_undecided():
    steady = [3.0 - 0.002 * i for i in range(120)]
    spike = steady[:80] + [9.0] * 12  # ten steps in a row far above the smoothed loss
    assert judge(spike, entropy=2.0)["verdict"] == "diverged"
    nan = steady[:50] + [math.nan]
    out = verdict(nan, {}, 2.0, 0.1)
    assert out["verdict"] == "diverged" and out["at_step"] == 51 and out["final_loss"] == pytest.approx(
        sum(steady[40:50]) / 10)
    assert verdict(steady[:30], {}, 2.0, 0.1, nonfinite_stop=30)["verdict"] == "diverged"
    # above the entropy and still descending when the steps ran out: neither trained nor stalled
    assert judge(steady, entropy=2.0)["verdict"] == "undecided"
    assert grad_ratio([0.5, 1.0, 2.0]) == 0.25 and grad_ratio([1.0]) is None and grad_ratio([1.0, 0.0]) is None


def test_render_lists_what_did_not_run():
    text = render([{"shape_name": "rr-1b", "rule": "review", "lr": 3e-4, "error": "OutOfMemoryError: CUDA"},
                   {"shape_name": "rr-1b", "rule": "highway", "lr": 9e-4, "skipped": "1 s of the time budget left"}])
    assert "not run: rr-1b review lr=0.0003: OutOfMemoryError: CUDA" in text
    assert "not run: rr-1b highway lr=0.0009: skipped, 1 s of the time budget left" in text


def test_story_rows_match_what_rrtrain_prep_writes(stories_data):
    manifest = json.loads((stories_data / "manifest.json").read_text())
    rows = story_rows(400, "byte", 64, val_rows=32)
    assert rows.vocab_size == manifest["vocab_size"] and rows.seq_len == 64 and rows.val.shape == (32, 65)
    assert rows.unigram_entropy == pytest.approx(manifest["unigram_entropy"], abs=0.01)  # another train split
    bpe = story_rows(100, "bpe:300", 32, val_rows=8)
    assert bpe.tokenizer == "bpe:300" and bpe.vocab_size == 300 and int(bpe.train.max()) < 300
    with pytest.raises(UsageError, match="raise the number of documents"):
        story_rows(2, "byte", 4096, val_rows=8)


def test_bad_input_is_refused_before_any_work(tmp_path):
    base = ["run", "--out", str(tmp_path / "r.jsonl"), "--shapes", "tiny"]
    with pytest.raises(UsageError, match="--steps"):
        depth_study.main(base + ["--steps", "1"])
    with pytest.raises(UsageError, match="unknown residual rule 'reveiw'"):
        depth_study.main(base + ["--rules", "reveiw"])
    with pytest.raises(UsageError, match="is a directory"):
        depth_study.main(["run", "--out", str(tmp_path), "--shapes", "tiny"])
    assert not (tmp_path / "r.jsonl").exists()


TINY = ["--shapes", "tiny", "--precision", "fp32", "--tokenizer", "byte", "--docs", "100", "--seq-len", "32",
        "--micro-batch", "4", "--set", "model.n_layers=2", "--set", "model.d_model=32", "--set", "model.n_heads=2"]


def test_a_learning_rate_after_another_trains_as_from_a_fresh_build(tmp_path):
    both, alone = tmp_path / "both.jsonl", tmp_path / "alone.jsonl"
    assert depth_study.main(["run", "--out", str(both), "--rules", "review", "--lr-factors", "1", "3", "--steps", "6",
                             *TINY]) == 0
    assert depth_study.main(["run", "--out", str(alone), "--rules", "review", "--lr-factors", "3", "--steps", "6",
                             *TINY]) == 0
    after = [json.loads(line) for line in both.read_text().splitlines()]
    fresh = json.loads(alone.read_text())
    assert [r["lr_factor"] for r in after] == [1, 3] and "build_s" in after[0] and "build_s" not in after[1]
    assert after[1]["losses"] == fresh["losses"] and after[1]["block_grad_norm"] == fresh["block_grad_norm"]
    assert after[0]["losses"][0] == fresh["losses"][0]  # the same weights and batch at step 1


@pytest.mark.slow
def test_convex_gate_stalls_and_additive_trains_at_20_sublayers(tmp_path):
    out = tmp_path / "d.jsonl"
    code = ("import sys\nfrom rrtrain.planning import depth_study\ncode = depth_study.main(sys.argv[1:])\n"
            "absent = sorted({m.split('.')[0] for m in sys.modules} & {'streaming', 'deepspeed', 'submitit'})\n"
            "print('imported:', absent)\nsys.exit(code)\n")
    args = ["run", "--out", str(out), "--shapes", "tiny", "--rules", "review_convex", "review", "--lr-factors", "1",
            "--steps", "100", "--micro-batch", "8", "--seq-len", "64", "--tokenizer", "byte", "--docs", "400",
            "--precision", "fp32", "--set", "model.n_layers=10", "--set", "model.d_model=32",
            "--set", "model.n_heads=2", "--set", "train.lr=0.003"]
    proc = subprocess.run([PY, "-c", code, *args], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "imported: []" in proc.stdout  # the study needs no streaming, deepspeed or submitit (the GPU lacks them)
    convex, review = [json.loads(line) for line in out.read_text().splitlines()]
    assert convex["sublayers"] == 20 and len(convex["block_grad_norm"]) == 10
    assert convex["verdict"] == "stalled" and convex["monitor"] == {
        "window": 25, "min_steps": 50, "min_improvement": 0.01, "entropy_margin": 0.1}
    assert 50 <= convex["at_step"] == convex["steps_done"] < 100 and abs(convex["vs_entropy"]) < 0.1
    assert review["verdict"] == "trained" and review["steps_done"] == 100 and review["vs_entropy"] < -0.1
    # the first block's gradient, against the last one's, is what collapsed in the stalled run
    assert grad_ratio(convex["block_grad_norm"]) < 0.01 < 0.5 < grad_ratio(review["block_grad_norm"])
    assert "| tiny | 20 | review_convex | 0.003 | stalled at " in proc.stdout
    assert "| tiny | 20 | review | 0.003 | trained | 100/100 |" in proc.stdout


def test_the_time_budget_caps_runs_and_skips_what_cannot_start(tmp_path, monkeypatch, capsys):
    out = tmp_path / "t.jsonl"
    args = ["run", "--out", str(out), "--rules", "review", "--lr-factors", "1", "3", "--steps", "50", *TINY]
    monkeypatch.setattr(depth_study, "MIN_RUN_S", -1e9)  # start every run, however little time is left
    assert depth_study.main(args + ["--budget-s", "0.001"]) == 0
    capped = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["time_capped"], r["steps_done"]) for r in capped] == [(True, 1), (True, 1)]
    assert "| tiny | 4 | review | 0.0003 | undecided (time cap) | 1/50 |" in capsys.readouterr().out
    monkeypatch.setattr(depth_study, "MIN_RUN_S", 2.0)
    assert depth_study.main(args + ["--budget-s", "0.001"]) == 1  # nothing could start
    skipped = [json.loads(line) for line in out.read_text().splitlines()]
    assert all("verdict" not in r and "time budget left" in r["skipped"] for r in skipped)
    assert depth_study.render_file(out, expected=3) == 1
    text = capsys.readouterr().out
    assert "not run: tiny review lr=0.0003: skipped, " in text and "not run: 1 more (the study was stopped" in text

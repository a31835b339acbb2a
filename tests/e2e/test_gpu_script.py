"""`tests/benchmarks/gpu.sh`'s tables (gpu_matrix.py's `render`) and helpers, on recorded rows: no process.

The script itself runs on CPU as three of gpu_device.sh's parts (tests/e2e/test_gpu_device_script.py: the sizes
table, the float8 pair, the large model at the plan's recommendation); here the tables' contents that part of it
does not reach (review against standard and against its matched baseline, the float8 bound, what failed).
"""

from __future__ import annotations

import json
import sys

import torch

from trainutil import REPO

sys.path.insert(0, str(REPO / "tests" / "benchmarks"))

import gpu_matrix  # noqa: E402


def test_render_prints_the_sizes_and_review_against_standard_and_its_matched_baseline(tmp_path, capsys):
    common = {"size": "rr-1b", "compile_mode": "true", "compile": True, "shape": {"seq_len": 2048}, "mfu": 0.4,
              "device": "NVIDIA H100 80GB HBM3", "world_size": 1, "precision": "bf16", "peak_source": "table:H100:bf16",
              "peak_flops": 989e12, "torch": "2.11.0", "torchao": "0.18.0", "ac": "none", "steps": 5, "warmup": 2,
              "auto": True, "planned_gb": 60.0, "peak_mem_gb": 50.0}
    rows = [{**common, "variant": "standard", "params": 7.6e8, "micro_batch": 12, "tokens_per_s": 80_000.0,
             "step_time_s": 0.30, "flops_per_token": 5.0e9},
            {**common, "variant": "standard@review", "params": 9.9e8, "micro_batch": 8, "tokens_per_s": 60_000.0,
             "step_time_s": 0.28, "flops_per_token": 6.2e9},
            {**common, "variant": "review", "params": 9.9e8, "micro_batch": 8, "tokens_per_s": 50_000.0,
             "step_time_s": 0.33, "flops_per_token": 6.3e9}]
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_matrix.render(results, expected=3) == 0
    out = capsys.readouterr().out
    assert "rrtrain bench: NVIDIA H100 80GB HBM3 x 1, torch 2.11.0, torchao 0.18.0" in out
    assert "| rr-1b | standard | 760.0M | yes | 12 (auto)x2048 | 80,000 | 40.0% | 50.0 | 60.0 | 300.0 |" in out
    assert "| rr-1b | yes | 1.100 |" in out  # review / standard step time
    assert "| rr-1b | yes | 1.200 | 1.016 | NO |" in out  # per token against the matched baseline, beside FLOPs
    assert "not measured" not in out


def test_render_reports_what_was_not_measured(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    rows = [{"size": "rr-1b", "variant": "standard", "compile_mode": "true", "error": "OutOfMemoryError: CUDA"},
            {"size": "rr-60m", "variant": "review", "compile_mode": "true", "skipped": "12 s of the time budget left"}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_matrix.render(results, expected=3) == 1
    out = capsys.readouterr().out
    assert "not measured: rr-1b standard compile=true: OutOfMemoryError: CUDA" in out
    assert "not measured: rr-60m review compile=true: skipped, 12 s of the time budget left" in out
    assert "not measured: 1 more (the run was stopped at its time limit)" in out


def test_plan_runs_eager_first_then_compiled_from_the_largest():
    assert gpu_matrix.plan(["rr-60m", "rr-1b"], ["standard", "review"], ["false", "true"]) == [
        ("rr-60m", "standard", "false"), ("rr-60m", "review", "false"),
        ("rr-1b", "standard", "false"), ("rr-1b", "review", "false"),
        ("rr-1b", "standard", "true"), ("rr-1b", "review", "true"),
        ("rr-60m", "standard", "true"), ("rr-60m", "review", "true")]


def test_render_checks_the_float8_loss_bound_and_the_plan(tmp_path, capsys):
    common = {"size": "rr-1b", "variant": "standard", "compile_mode": "true", "compile": True, "micro_batch": 16,
              "shape": {"seq_len": 1024}, "mfu": 0.4, "peak_mem_gb": 40.0, "step_time_s": 0.2, "device": "NVIDIA H200",
              "world_size": 1, "precision": "bf16", "peak_source": "table:H200:bf16", "peak_flops": 989e12}
    bf16 = {**common, "kind": "float8", "float8": "off", "tokens_per_s": 80_000.0, "losses": [10.0, 6.0, 4.0, 3.0]}
    f8 = {**common, "kind": "float8", "float8": "rowwise", "tokens_per_s": 100_000.0, "losses": [10.0, 6.0, 4.0, 3.1]}
    big = {**common, "kind": "big", "size": "frontier-7b", "params": 5.7e9, "ac": "none", "micro_batch": 2,
           "tokens_per_s": 9_000.0, "peak_mem_gb": 110.0, "planned_gb": 102.4, "plan_gpu": "h200",
           "peak_mem_kind": "cuda max allocated"}
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (bf16, f8, big)))
    assert gpu_matrix.render(results, expected=3, loss_bound=0.05) == 0
    out = capsys.readouterr().out
    assert "float8 rowwise / bf16: tokens/s x1.250 (target >= 1.20); loss +3.33% (bound 5%): within" in out
    assert "measured 110.0 GiB, planned 102.4 GiB (measured / planned 1.074; within ±20%: yes)" in out
    assert gpu_matrix.render(results, expected=3, loss_bound=0.02) == 1  # drifted beyond the bound: a failure
    assert "OUTSIDE THE BOUND" in capsys.readouterr().out

    # a 7B that fits no setting of this GPU (an H100: its fp32 state alone) is an answer, not a failure
    nofit = {"kind": "big", "size": "frontier-7b", "variant": "standard", "compile_mode": "true",
             "unsupported": "rrtrain plan finds no setting of frontier-7b that fits one H100"}
    results.write_text(json.dumps(nofit) + "\n")
    assert gpu_matrix.render(results, expected=1) == 0
    out = capsys.readouterr().out
    assert "frontier-7b standard: not run: rrtrain plan finds no setting of frontier-7b that fits one H100" in out
    assert "not measured" not in out


def test_markov_batches_are_seeded_and_learnable():
    a = gpu_matrix.markov_batches(300, 16, 3, seed=1, step=5, device="cpu")[0]
    assert a.shape == (3, 17) and int(a.max()) < 300
    assert torch.equal(a, gpu_matrix.markov_batches(300, 16, 3, seed=1, step=5, device="cpu")[0])
    assert not torch.equal(a, gpu_matrix.markov_batches(300, 16, 3, seed=1, step=6, device="cpu")[0])
    successors = {}
    for row in a.tolist():
        for x, y in zip(row, row[1:]):
            successors.setdefault(x, set()).add(y)
    assert max(len(v) for v in successors.values()) <= 4  # each token has at most 4 successors

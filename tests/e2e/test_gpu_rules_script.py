"""`tests/benchmarks/gpu_rules.sh`'s helpers in gpu_matrix.py: the rules' table, the shared micro-batch.

The script itself runs on CPU as two of gpu_device.sh's parts (tests/e2e/test_gpu_device_script.py: the depth
study, and every rule against `standard` through gpu_matrix.py); here what those parts do not reach on a CPU:
`MICRO=shared`'s choice (on a GPU it sizes against the free memory; here the free bytes are given) and its note
in the table. About 2 s of CPU (the planner traces two tiny models on fake tensors).
"""

from __future__ import annotations

import json
import sys

import torch

from rrtrain.parallel.auto_batch import MARGIN, planned_peak
from rrtrain.resolve import load, resolve
from trainutil import REPO

sys.path.insert(0, str(REPO / "tests" / "benchmarks"))

import gpu_matrix  # noqa: E402


def test_shared_micro_is_the_largest_batch_every_rule_fits():
    cfgs = [load(gpu_matrix.TINY, gpu_matrix.base_overrides("micro", v, "false", "auto", 1)
                 + ["model.vocab_size=258", "model.seq_len=32"]) for v in ("standard", "mhc")]
    peaks = [planned_peak(resolve(c), 1) for c in cfgs]
    assert peaks[0](16) < peaks[1](12) < peaks[1](16)  # mhc's four streams need more than standard's one
    free = int(peaks[1](12) / (1 - MARGIN)) + 1  # standard alone would take 16 of these bytes, mhc 12
    m, got_free, planned = gpu_matrix.shared_micro(cfgs, 1, torch.device("cpu"), free_bytes=free)
    assert (m, got_free, planned) == (12, free, [peaks[0](12), peaks[1](12)])


def test_render_rules_shows_the_shared_batch_and_review_against_its_matched_baseline(tmp_path, capsys):
    common = {"size": "rr-1b", "compile_mode": "true", "compile": True, "shape": {"seq_len": 2048}, "mfu": 0.4,
              "device": "NVIDIA H200", "world_size": 1, "precision": "bf16", "ac": "none", "steps": 8, "warmup": 2,
              "auto": "shared", "micro_batch": 8, "peak_mem_gb": 40.0}
    rows = [{**common, "variant": "standard", "params": 7.6e8, "flops_ratio": 1.0, "tokens_per_s": 60_000.0,
             "step_time_s": 0.30, "step_time_median_s": 0.30, "flops_per_token": 5.0e9},
            {**common, "variant": "standard@review", "params": 9.9e8, "flops_ratio": None, "tokens_per_s": 50_000.0,
             "step_time_s": 0.36, "step_time_median_s": 0.36, "flops_per_token": 6.2e9},
            {**common, "variant": "review", "params": 9.9e8, "flops_ratio": 1.27, "tokens_per_s": 48_000.0,
             "step_time_s": 0.375, "step_time_median_s": 0.375, "flops_per_token": 6.3e9}]
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_matrix.render_rules(results, expected=3) == 0
    out = capsys.readouterr().out
    assert "### rr-1b, compile yes: 8 (shared) x 2048 tokens per GPU per step" in out
    assert "| review | 990.0M | 1.270 | 375.0 | 1.250 | 48,000 | 40.0% | 40.0 | 1.00 |  |" in out
    assert "| rr-1b | yes | 1.042 | 1.016 | yes |" in out  # against standard@review, per token, with its target


def test_variant_labels_carry_their_residual_settings():
    assert gpu_matrix.variant_overrides("hc_static") == ["model.variant=hc", "model.residual.hc_dynamic=false"]
    assert gpu_matrix.variant_overrides("attnres_block_4") == ["model.variant=attnres",
                                                                "model.residual.attnres_block_size=4"]
    assert gpu_matrix.variant_overrides("gr") == ["model.variant=gr"]


def test_render_rules_reports_what_was_not_measured(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    rows = [{"size": "rr-1b", "variant": "mhc", "compile_mode": "true", "error": "OutOfMemoryError: CUDA"},
            {"size": "rr-150m", "variant": "gr", "compile_mode": "true", "skipped": "12 s of the time budget left"}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_matrix.render_rules(results, expected=3) == 1
    out = capsys.readouterr().out
    assert "not measured: rr-1b mhc compile=true: OutOfMemoryError: CUDA" in out
    assert "not measured: rr-150m gr compile=true: skipped, 12 s of the time budget left" in out
    assert "not measured: 1 more (the run was stopped at its time limit)" in out

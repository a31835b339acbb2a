"""`rrtrain bench`: a couple of steps of `tiny` on random tokens report positive, consistent figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rrtrain import cli

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "train" / "tiny.yaml")

KEYS = {
    "variant", "size", "shape", "params", "backend", "zero_stage", "precision", "compile", "ac", "world_size",
    "device", "threads", "micro_batch", "global_batch", "accum", "warmup", "steps", "step_time_s",
    "step_time_median_s", "step_time_min_s", "step_cpu_time_s", "tokens_per_s", "tokens_per_s_total", "flops_per_token",
    "tflops_per_s", "peak_flops", "peak_source", "mfu", "peak_mem_gb", "peak_mem_kind", "loss_first", "loss_last",
    "param_bytes", "optim_bytes",
}
# byte-level vocabulary (as `tiny` trains in the demo) and short sequences keep this to a second or two
SMALL = ["model.vocab_size=258", "model.seq_len=32", "train.global_batch=4", "train.micro_batch=2"]


def bench_json(capsys, *args: str) -> dict:
    assert cli.main(["bench", *args, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_bench_tiny_json(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # bench must leave nothing behind (no run directory, no checkpoints)
    r = bench_json(capsys, *SMALL, "--steps", "2", "--warmup", "1")
    assert set(r) == KEYS
    assert r["size"] == "tiny" and r["variant"] == "review" and r["backend"] == "none"  # configs/train/tiny.yaml
    assert r["accum"] == 2 and r["steps"] == 2 and r["world_size"] == 1
    for key in ("step_time_s", "step_time_min_s", "step_cpu_time_s", "tokens_per_s", "tokens_per_s_total", "flops_per_token",
                "tflops_per_s", "peak_flops", "mfu", "peak_mem_gb", "param_bytes", "optim_bytes", "params"):
        assert r[key] > 0 and math.isfinite(r[key]), key
    assert r["tokens_per_s"] == pytest.approx(4 * 32 / r["step_time_s"])
    assert r["mfu"] == pytest.approx(r["flops_per_token"] * r["tokens_per_s"] / r["peak_flops"])
    assert r["param_bytes"] == 4 * r["params"]  # fp32, one process: the whole model
    assert r["optim_bytes"] == pytest.approx(2 * r["param_bytes"], rel=0.01)  # AdamW's two moments (+ step counts)
    assert "probe" in r["peak_source"]
    assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
    assert list(tmp_path.iterdir()) == []


def test_bench_table(capsys):
    assert cli.main(["bench", TINY, *SMALL, "--steps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    for word in ("tokens/s", "MFU", "peak:", "memory", "step time"):
        assert word in out


@pytest.mark.parametrize("args, message", [
    (["train.globl_batch=8"], "did you mean 'train.global_batch'"),
    (["parallel.backend=zero"], "parallel.backend"),
    (["train.global_batch=5", "train.micro_batch=2"], "not a multiple"),
    (["--steps", "0"], "--steps"),
    ([TINY, TINY], "more than one config"),
    (["configs/train/missing.yaml"], "cannot read config"),
])
def test_bench_bad_input_exits_2(capsys, args, message):
    assert cli.main(["bench", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err

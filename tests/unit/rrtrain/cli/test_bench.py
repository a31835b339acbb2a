"""`rrtrain bench`: a couple of steps of `tiny` on random tokens report positive, consistent figures."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rrtrain.cli import main as cli
from trainutil import REPO

TINY = str(REPO / "configs" / "train" / "tiny.yaml")

KEYS = {
    "variant", "size", "shape", "params", "backend", "zero_stage", "precision", "compile", "ac", "world_size",
    "device", "threads", "micro_batch", "global_batch", "accum", "warmup", "steps", "step_time_s",
    "step_time_median_s", "step_time_min_s", "step_cpu_time_s", "tokens_per_s", "tokens_per_s_total", "flops_per_token",
    "tflops_per_s", "peak_flops", "peak_source", "mfu", "peak_mem_gb", "peak_mem_kind", "loss_first", "loss_last",
    "param_bytes", "optim_bytes", "float8", "auto_micro_batch",
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


@pytest.mark.slow
def test_bench_times_the_training_step(capsys, monkeypatch, tmp_path, stories_data):
    """Bench and a one-step training run call the one `rrtrain.training.step.optimizer_step`; from the same weights
    and the same micro-batches they leave bitwise-equal parameters (so bench cannot drift from training)."""
    from rrtrain.planning import bench
    from rrtrain import train
    from rrtrain.training import step, trainer
    from rrtrain.resolve import load

    assert bench.optimizer_step is step.optimizer_step and trainer.optimizer_step is step.optimizer_step
    after: dict[str, dict] = {}
    consumed: list[torch.Tensor] = []

    def spy(who: str):
        def wrapped(engine, batches, accum, *args, **kwargs):
            if who == "train":  # keep the training step's micro-batches for bench
                consumed.extend(next(batches) for _ in range(accum))
                batches = iter(consumed)
            out = step.optimizer_step(engine, batches, accum, *args, **kwargs)
            after[who] = {k: v.detach().clone() for k, v in engine.inner.state_dict().items()}
            return out
        return wrapped

    monkeypatch.setattr(trainer, "optimizer_step", spy("train"))
    monkeypatch.setattr(bench, "optimizer_step", spy("bench"))
    same = [f"data.path={stories_data}", "train.global_batch=4", "train.micro_batch=2", "train.compile=false"]
    cfg = load(TINY, [*same, f"run.dir={tmp_path / 'run'}", "train.max_steps=1", "train.warmup_steps=1",
                      "data.eval_batches=1"])
    assert train.run(cfg) == 0  # one warm-up step: step 1 runs at train.lr, as bench steps
    assert len(consumed) == 2  # accumulation 2
    monkeypatch.setattr(bench, "random_batches", lambda *a: consumed)
    r = bench_json(capsys, TINY, *same, "--steps", "1", "--warmup", "0")
    assert r["accum"] == 2 and set(after) == {"train", "bench"}
    assert after["train"].keys() == after["bench"].keys()
    for key, value in after["train"].items():
        assert torch.equal(value, after["bench"][key]), key


def test_only_the_step_module_runs_backward_and_the_optimizer():
    """No second copy of the step: outside the engines, only rrtrain/training/step.py calls backward, clip or step."""
    package = REPO / "rrtrain"
    callers = {str(p.relative_to(package)) for p in package.rglob("*.py") if "parallel" not in p.parts
               and any(f".{name}(" in p.read_text() for name in ("backward", "clip_grad_norm", "step_unless"))}
    assert callers == {"training/step.py"}

"""`rrtrain plan`: the model's pieces (FSDP shard sizes, traced activations, time) and the command line.

Runtime: about 20 s (fake-tensor traces of rr-1b, frontier-7b and frontier-70b; no model is allocated).
"""

from __future__ import annotations

import json

import pytest
import torch

from rrtrain import sizing
from rrtrain.cli.main import main
from rrtrain.config import ModelConfig
from rrtrain.parallel.memory import AC_MODES, Setup, fitting, gpu_spec, layout, plan, resolve, shard_numel

GIB = 2**30


@pytest.mark.parametrize("shape,world", [((50257, 64), 512), ((7, 3), 4), ((5,), 4), ((8, 2), 8), ((3, 4), 8)])
def test_shard_numel_is_torch_chunk(shape, world):
    chunks = torch.empty(shape).chunk(world, dim=0)
    for rank in range(world):
        expect = chunks[rank].numel() if rank < len(chunks) else 0
        assert shard_numel(shape, world, rank) == expect
    assert sum(shard_numel(shape, world, r) for r in range(world)) == torch.Size(shape).numel()


@pytest.mark.parametrize("variant", ["standard", "review", "mhc", "attnres"])
def test_layout_counts_what_sizing_counts(variant):
    m = ModelConfig(size="rr-60m", variant=variant)
    shape = resolve(m)
    assert layout(m, shape).numel == sizing.count_params(shape, variant, m.residual)


def test_one_process_holds_sixteen_bytes_per_parameter():
    p = plan(Setup(ModelConfig(size="tiny"), gpus=1, backend="none", precision="fp32"))
    assert p.state_bytes == 16 * p.params + 4 * len(layout(p.setup.model, p.shape).tensors)


def test_fsdp_state_shrinks_with_the_shard_group_and_hsdp_keeps_it():
    m = ModelConfig(size="rr-1b")
    eight, sixty_four = plan(Setup(m, gpus=8)), plan(Setup(m, gpus=64))
    assert eight.category("parameters") == pytest.approx(8 * sixty_four.category("parameters"), rel=0.01)
    hsdp = plan(Setup(m, gpus=64, dp_shard=8))
    assert hsdp.category("optimizer") == eight.category("optimizer")
    assert hsdp.comm_bytes > eight.comm_bytes  # the replicas' all-reduce comes on top


def test_checkpointing_cuts_activations_and_costs_time():
    p = plan(Setup(ModelConfig(size="frontier-7b"), gpus=64, tokens=1e12))
    assert p.activations["full"] < p.activations["selective"] < p.activations["none"]
    full = plan(Setup(ModelConfig(size="frontier-7b"), gpus=64, tokens=1e12, ac="full"))
    assert full.time_s == pytest.approx(p.time_s * (1 + 1 / 3))


def test_activations_scale_with_micro_batch_and_streams():
    m = ModelConfig(size="rr-60m")
    mb1, mb4 = plan(Setup(m, gpus=8)), plan(Setup(m, gpus=8, micro_batch=4))
    assert mb4.activations["none"] == 4 * mb1.activations["none"]
    four = plan(Setup(ModelConfig(size="rr-60m", variant="mhc"), gpus=8))
    two = plan(Setup(ModelConfig(size="rr-60m", variant="mhc", residual=dict(streams=2)), gpus=8))
    assert mb1.activations["full"] < two.activations["full"] < four.activations["full"]  # checkpoints hold n streams


def test_time_is_flops_over_peak_times_mfu():
    p = plan(Setup(ModelConfig(size="rr-1b"), gpus=8, gpu="a100", tokens=2e10, mfu=0.5))
    peak, _ = gpu_spec("a100")
    assert p.time_s == pytest.approx(2e10 * p.flops_per_token / (8 * peak * 0.5))
    assert p.gpu_hours == pytest.approx(p.time_s * 8 / 3600)


def test_accumulation_under_fsdp_keeps_unsharded_gradients():
    small = plan(Setup(ModelConfig(size="rr-1b"), gpus=8, micro_batch=2, global_batch=64))
    assert small.setup.accum == 4 and any("unsharded" in i.what for i in small.transient)
    assert not small.warnings  # 2.8 GiB: under 5% of the GPU, listed but not warned about
    big = plan(Setup(ModelConfig(size="frontier-7b"), gpus=64, micro_batch=1, global_batch=128))
    no_accum = plan(Setup(ModelConfig(size="frontier-7b"), gpus=64, micro_batch=1))
    assert big.warnings and big.total() - no_accum.total() == 4 * big.params  # one unsharded fp32 copy


def test_fitting_lists_only_settings_that_fit():
    s = Setup(ModelConfig(size="frontier-70b"), gpus=512, gpu="h100")
    found = fitting(s)
    assert found and all(f.fits for f in found)
    assert {f.setup.ac for f in found} <= set(AC_MODES)
    assert not plan(Setup(ModelConfig(size="frontier-70b"), gpus=8, gpu="h100")).fits


def test_cli_json(capsys):
    assert main(["plan", "--size", "frontier-7b", "--gpus", "64", "--tokens", "1T", "--ac", "selective",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"] == plan(Setup(ModelConfig(size="frontier-7b"), gpus=64)).params
    assert out["memory_bytes"]["peak"] < out["memory_bytes"]["usable"] and out["fits"]
    assert out["gpu_hours"] > 0 and out["fitting_settings"]


def test_cli_text(capsys):
    assert main(["plan", "--size", "rr-1b", "--gpus", "8", "--gpu", "h200", "--variant", "review",
                 "--backend", "deepspeed", "--zero-stage", "3", "--tokens", "20B"]) == 0
    out = capsys.readouterr().out
    assert "rr-1b review" in out and "H200" in out and "GPU-hours" in out and "settings that fit" in out


@pytest.mark.parametrize("argv,needle", [
    (["--size", "rr-9b", "--gpus", "8"], "unknown preset 'rr-9b'"),
    (["--size", "rr-1b", "--gpus", "8", "--gpu", "h900"], "unknown GPU 'h900'"),
    (["--size", "rr-1b", "--gpus", "0"], "must be at least 1"),
    (["--size", "rr-1b", "--gpus", "8", "--dp-shard", "3"], "--dp-shard=3 must divide --gpus=8"),
    (["--size", "rr-1b", "--gpus", "8", "--variant", "reviw"], "did you mean 'review'"),
    (["--size", "rr-1b", "--gpus", "8", "--backend", "none"], "--backend none runs one process"),
    (["--size", "rr-1b", "--gpus", "8", "--ac", "some"], "--ac must be one of"),
    (["--size", "rr-1b", "--gpus", "8", "--mfu", "1.5"], "--mfu must be in (0, 1]"),
    (["--size", "rr-1b", "--gpus", "8", "--tokens", "lots"], "expected a token count"),
    (["--size", "rr-1b", "--gpus", "8", "--global-batch", "12"], "not a multiple"),
    (["--size", "rr-1b", "--gpus", "8", "--set", "residual.streamz=2"], "unknown key"),
    (["--gpus", "8"], "--size"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, argv, needle):
    assert main(["plan", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err
    assert needle in err, err


def test_fp32_tf32_stores_fp32_and_runs_at_the_tf32_peak():
    m = ModelConfig(size="rr-60m", variant="review")
    tf32, fp32, bf16 = (plan(Setup(m, gpus=8, tokens=10**9, precision=p)) for p in ("fp32_tf32", "fp32", "bf16"))
    assert tf32.total() == fp32.total()  # only the matmuls differ
    assert tf32.time_s == pytest.approx(bf16.time_s * gpu_spec("h100")[0] / gpu_spec("h100", "fp32_tf32")[0])
    assert tf32.time_s > bf16.time_s

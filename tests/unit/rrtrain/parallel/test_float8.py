"""`parallel.float8`'s plumbing on CPU: which layers convert, the refusal without float8 hardware, and that a converted
model's state carries over to a bf16/fp32 model and back (its checkpoints load into a bf16 run).

The conversion runs with the hardware check bypassed (`_check_hardware=False`, torchao's emulation), on a tiny
model: d_model 128 (multiples of 16) with an MLP width of 520 (not one), so the rule's both halves show.
Runtime: ~20 s of CPU, a third of it importing torchao; the FSDP2 test runs one process.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from trainutil import PY, REPO, TINY, env

pytest.importorskip("torchao.float8")

from rrtrain.config import load_config  # noqa: E402
from rrtrain.core.errors import UsageError  # noqa: E402
from rrtrain.resolve import build_model  # noqa: E402
from rrtrain.parallel import float8  # noqa: E402
from rrtrain.parallel.materialize import place  # noqa: E402
from rrtrain.resolve import load, resolve  # noqa: E402

SHAPE = ["model.variant=review", "model.d_model=128", "model.n_heads=4", "model.d_ff=520", "model.n_layers=2",
         "model.vocab_size=258", "model.seq_len=32"]


def tiny(device: str = "cpu", seed: int = 0, d_ff: int = 520, variant: str = "review"):
    cfg = load(TINY, SHAPE + [f"model.d_ff={d_ff}", f"model.variant={variant}"])
    run = resolve(cfg)
    return build_model(cfg.model, shape=run.shape, device=device, rule=run.rule, seed=seed)


def converted_names(model) -> list[str]:
    return sorted(n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear")


def test_the_blocks_large_linears_convert_and_nothing_else():
    model = tiny()
    names = float8.convert(model, "rowwise", fsdp=False, min_dim=128, _check_hardware=False)
    expected = sorted(f"blocks.{b}.attn.{layer}" for b in range(2) for layer in ("qkv", "proj"))
    assert sorted(names) == expected == converted_names(model)  # mlp.fc / mlp.proj: 520 is no multiple of 16
    assert type(model.tok_emb).__name__ == "Embedding"  # the embedding and the tied LM head stay as they are
    assert type(model.blocks[0].attn_site.gate.proj).__name__ == "Linear"  # the rule's own layers too (128 x 256)
    model = tiny(d_ff=512)
    names = float8.convert(model, "rowwise", fsdp=False, min_dim=128, _check_hardware=False)
    assert sorted(names) == sorted(f"blocks.{b}.{layer}" for b in range(2)
                                   for layer in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"))
    # the size rule: both dimensions at least min_dim (the attention's 128 x 128 stays below 256)
    assert float8.convert(tiny(), "tensorwise", fsdp=False, min_dim=256, _check_hardware=False) == []
    assert float8.convert(tiny(), "off", fsdp=False) == []


def test_a_rule_that_hooks_its_branch_layers_keeps_its_hooks_on_the_converted_layers():
    """Fixup puts scalar biases on the branch's layers by hooks: they must sit on the Float8Linear that runs."""
    model = tiny(d_ff=512, variant="fixup")
    plain = tiny(d_ff=512, variant="fixup")
    for m in (model, plain):
        with torch.no_grad():
            for site in (m.blocks[0].attn_site, m.blocks[0].mlp_site):
                site.bias_proj.fill_(0.5)
    float8.convert(model, "rowwise", fsdp=False, min_dim=128, _check_hardware=False)
    for name in ("attn.proj", "mlp.proj", "mlp.fc"):
        layer = model.blocks[0].get_submodule(name)
        assert type(layer).__name__ == "Float8Linear" and (layer._forward_pre_hooks or layer._forward_hooks), name
    idx = torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = model(idx), plain(idx)
    assert (got - want).abs().max() < 0.05 * want.abs().max()  # float8's rounding, not a missing bias of 0.5


def test_tensorwise_under_fsdp_all_gathers_in_float8_and_rowwise_does_not():
    model = tiny()
    float8.convert(model, "tensorwise", fsdp=True, min_dim=128, _check_hardware=False)
    assert float8.needs_scale_precompute(model)
    model = tiny()
    float8.convert(model, "rowwise", fsdp=True, min_dim=128, _check_hardware=False)
    assert not float8.needs_scale_precompute(model)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_converted_model_trains_in_emulation_and_its_state_loads_into_a_plain_model():
    """Same keys, same values, both ways; through DCP, the format the engines checkpoint in."""
    import torch.distributed.checkpoint as dcp

    model = tiny()
    float8.convert(model, "rowwise", fsdp=False, min_dim=128, _check_hardware=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 258, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    opt.step()
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert all(type(v) is torch.Tensor and v.dtype == torch.float32 for v in saved.values())  # no float8 state

    plain = tiny(seed=1)
    assert set(plain.state_dict()) == set(saved)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        dcp.save({"model": model.state_dict()}, checkpoint_id=d)
        target = {"model": plain.state_dict()}
        dcp.load(target, checkpoint_id=d)
        plain.load_state_dict(target["model"])
    for k, v in plain.state_dict().items():
        assert torch.equal(v, saved[k]), k
    back = tiny(seed=2)  # and a bf16/fp32 checkpoint into a converted model
    float8.convert(back, "rowwise", fsdp=False, min_dim=128, _check_hardware=False)
    back.load_state_dict(plain.state_dict())
    assert all(torch.equal(v, saved[k]) for k, v in back.state_dict().items())


def test_conversion_on_meta_then_materialised_gives_the_plain_models_weights():
    """The trainer's path: built on meta, converted, materialised unit by unit from the seed."""
    model = tiny("meta")
    float8.convert(model, "rowwise", fsdp=False, min_dim=128, _check_hardware=False)
    place(model, torch.device("cpu"), 0)
    plain = tiny("meta")
    place(plain, torch.device("cpu"), 0)
    assert converted_names(model)
    ref = plain.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())


def test_refused_without_float8_hardware():
    with pytest.raises(UsageError, match="compute capability 8.9"):
        float8.require_hardware("rowwise", torch.device("cpu"))
    float8.require_hardware("off", torch.device("cpu"))  # off needs nothing
    with pytest.raises(UsageError, match="compute capability 8.9"):
        float8.convert(tiny(), "rowwise", fsdp=False, device=torch.device("cpu"))


def test_config_keys():
    assert load_config(TINY, ["parallel.float8=off"]).parallel.float8 == "off"
    assert load_config(TINY, ["parallel.float8=false"]).parallel.float8 == "off"  # YAML's bare `off`
    cfg = load_config(TINY, ["parallel.float8=tensorwise", "parallel.precision=bf16", "parallel.backend=fsdp"])
    assert cfg.parallel.float8 == "tensorwise" and cfg.to_dict()["parallel"]["float8"] == "tensorwise"
    for bad, words in ((["parallel.float8=yes"], "expected one of"), (["parallel.float8=e5m2"], "expected one of"),
                       (["parallel.float8=rowwise"], "parallel.precision=bf16"),
                       (["parallel.float8=rowwise", "parallel.precision=bf16", "parallel.backend=deepspeed"],
                        "fsdp or none")):
        with pytest.raises(UsageError, match=words):
            load_config(TINY, bad)


def test_train_refuses_float8_on_cpu_in_one_line_and_writes_nothing(tmp_path, capsys):
    """`rrtrain train` in this process (the command's main)."""
    from rrtrain.cli.main import main

    run_dir = tmp_path / "run"
    assert main(["train", TINY, f"run.dir={run_dir}", f"data.path={tmp_path}", "parallel.float8=rowwise",
                 "parallel.precision=bf16"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "parallel.float8=rowwise needs a GPU with float8 matmuls" in lines[0], err
    assert not run_dir.exists()


FSDP_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import gpu_matrix
gpu_matrix.single_rank_env()
import rrtrain.parallel.float8 as f8
from rrtrain.parallel import prepare
convert = f8.convert
f8.require_hardware = lambda setting, device: None  # this CPU has no float8 matmuls: torchao's emulation instead
prepare.convert_float8 = lambda model, setting, fsdp: convert(model, setting, fsdp, min_dim=64, _check_hardware=False)
from rrtrain.core import dist
from rrtrain.planning.bench import run_bench
from rrtrain.resolve import load
info = dist.setup(600)
out = {}
for recipe, ac in (("off", "none"), ("rowwise", "none"), ("tensorwise", "full")):
    cfg = load(gpu_matrix.TINY, ["model.size=micro", "model.d_model=64", "model.n_heads=4", "model.vocab_size=258",
                                 "model.seq_len=32", "parallel.backend=fsdp", "parallel.precision=bf16",
                                 f"parallel.float8={recipe}", f"parallel.ac={ac}", "train.micro_batch=2",
                                 "train.global_batch=2", "train.compile=false"])
    r = run_bench(cfg, 2, 1, info)
    out[recipe] = [r["loss_first"], r["loss_last"]]
dist.teardown()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_float8_composes_with_fsdp2_and_activation_checkpointing_in_emulation():
    """The trainer's engine path on one gloo rank: conversion, AC, FSDP2 (tensorwise: float8 all-gather and the
    scales computed after each step), materialisation; three AdamW steps train like bf16's."""
    proc = subprocess.run([PY, "-c", FSDP_SCRIPT, str(REPO / "tests" / "benchmarks")], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = json.loads(proc.stdout.strip().splitlines()[-1])
    for recipe in ("rowwise", "tensorwise"):
        first, last = losses[recipe]
        assert abs(first - losses["off"][0]) < 0.01 and last < first - 0.5, losses  # same start, trains

"""`rrtrain.artifact.load_run` on runs of 2 ranks: an FSDP2 one (DCP, two shards) and a DeepSpeed ZeRO-2 one (its
own files, optimizer state partitioned). The model artifact training wrote (consolidated in memory by
`Engine.full_model_state`) and the checkpoint read on one process without a process group (the engines' offline
reader, rrtrain/parallel/consolidate.py) are each compared with the same checkpoint read back by torch's and
DeepSpeed's own whole-model readers: bit for bit. A warm start (`init.from`) of a 2-rank FSDP2 run from the FSDP run
and of a 2-rank ZeRO-3 run from the ZeRO-2 one (one step each at a learning rate of 1e-30, which moves no fp32
weight) loads the source's weights into its shards exactly as one process loads them: its own artifact is the
source's, bit for bit. The DeepSpeed runs train ReZero: its one-element gates (fewer elements than ranks) are the
case DeepSpeed's own whole-parameter setter gets wrong at ZeRO-3 (it slices past the last rank's padded partition).
tests/unit/rrtrain/export/test_export_hf.py covers single-process runs and the exported model's logits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rrtrain.artifact import load_run
from trainutil import train

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "train.max_steps=3", "train.global_batch=4",
         "train.micro_batch=2", "train.warmup_steps=1", "train.compile=false", "train.eval_every=0",
         "data.eval_batches=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, stories_data: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sharded")
    out = {"fsdp": root / "fsdp", "deepspeed": root / "deepspeed"}
    train(out["fsdp"], stories_data, *SMALL, "model.variant=mhc", "parallel.backend=fsdp", nproc=2)
    train(out["deepspeed"], stories_data, *SMALL, "model.variant=rezero", "parallel.backend=deepspeed",
          "parallel.zero_stage=2", nproc=2)
    return out


def _same(loaded: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert set(loaded) == set(reference)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, reference[name].to(tensor.dtype)), name


def test_fsdp_shards_load_on_one_process(runs: dict[str, Path], tmp_path: Path) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    r = load_run(runs["fsdp"])
    assert r.checkpoint == runs["fsdp"] / "artifact" / "step_00000003"
    state = runs["fsdp"] / "checkpoints" / "step_00000003" / "state"
    assert len(list(state.glob("*.distcp"))) == 2
    dcp_to_torch_save(str(state), str(tmp_path / "whole.pt"))
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)["model"]
    _same(r.model.state_dict(), whole)  # the artifact: full_model_state of FSDP2 over 2 ranks
    shutil.copytree(runs["fsdp"], tmp_path / "legacy")
    shutil.rmtree(tmp_path / "legacy" / "artifact")
    _same(load_run(tmp_path / "legacy").model.state_dict(), whole)  # a run from before artifacts


def test_deepspeed_checkpoint_loads_and_exports(runs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file

    from rrtrain.cli.main import main as cli

    r = load_run(runs["deepspeed"])
    assert r.checkpoint == runs["deepspeed"] / "artifact" / "step_00000003"
    module_states = runs["deepspeed"] / "checkpoints" / "step_00000003" / "state" / "zero" / "mp_rank_00_model_states.pt"
    whole = torch.load(module_states, weights_only=False)["module"]  # fp32 ZeRO-2: whole
    _same(r.model.state_dict(), whole)  # the artifact: DeepSpeed's in-memory consolidation over 2 ranks
    shutil.copytree(runs["deepspeed"], tmp_path / "legacy")
    shutil.rmtree(tmp_path / "legacy" / "artifact")
    _same(load_run(tmp_path / "legacy").model.state_dict(), whole)  # zero_to_fp32 on the checkpoint
    assert cli(["export", str(runs["deepspeed"]), "--hf", str(tmp_path / "hf")]) == 0
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    _same({k.removeprefix("model."): v for k, v in exported.items()}, r.model.state_dict())


@pytest.fixture(scope="module")
def warm(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, stories_data: Path) -> dict[str, Path]:
    """2-rank runs warm-started from the runs above, one step each that moves no weight."""
    root = tmp_path_factory.mktemp("warm")
    out = {"fsdp": root / "fsdp", "zero3": root / "zero3"}
    still = ["train.max_steps=1", "train.lr=1e-30"]
    train(out["fsdp"], stories_data, *SMALL, *still, "model.variant=mhc", "parallel.backend=fsdp",
          f"init.from={runs['fsdp']}", nproc=2)
    train(out["zero3"], stories_data, *SMALL, *still, "model.variant=rezero", "parallel.backend=deepspeed",
          "parallel.zero_stage=3", f"init.from={runs['deepspeed']}", nproc=2)
    return out


@pytest.mark.parametrize("backend,source", [("fsdp", "fsdp"), ("zero3", "deepspeed")])
def test_a_warm_start_on_two_ranks_loads_the_sources_weights(runs: dict[str, Path], warm: dict[str, Path],
                                                              backend: str, source: str) -> None:
    import hashlib
    import json

    src = load_run(runs[source])
    got = load_run(warm[backend])
    assert got.step == 1 and got.checkpoint == warm[backend] / "artifact" / "step_00000001"
    _same(got.model.state_dict(), src.model.state_dict())  # sharded over 2 ranks, gathered back: the same bits
    record = json.loads((warm[backend] / "init.json").read_text())
    weights = runs[source] / "artifact" / "step_00000003" / "model.safetensors"
    assert (record["kind"], record["step"]) == ("run", 3)
    assert record["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()

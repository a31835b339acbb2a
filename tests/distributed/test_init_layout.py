"""The initial weights do not depend on the world size, the sharding or the backend: the full state gathered
at step 0 is bitwise the same for one process, FSDP2 on 2 and 4 ranks and ZeRO-3 on 2 ranks (torchrun, gloo),
and the same as a model built whole on the CPU from the same seed; so are the names excluded from weight
decay. Runtime: about 2 min on the loaded 2-core machine (one launch per layout, four variants in each)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from rrtrain.config import Config
from rrtrain.config_load import apply_overrides, build
from rrtrain.resolve import build_model
from trainutil import PY, REPO, env, free_port

pytestmark = pytest.mark.distributed

WORKER = str(REPO / "tests" / "distributed" / "init_state_worker.py")
#: rules that draw random numbers of their own (gates, controllers, mixing maps, Fixup's re-drawn branches)
VARIANTS = ["review", "gr", "mhc", "fixup"]
#: an odd vocabulary and 3-element parameters (mHC's alpha): uneven shards, and an empty one on 4 ranks
BASE = ["model.size=tiny", "model.vocab_size=67", "model.seq_len=16", "model.n_layers=2", "train.seed=7",
        "train.global_batch=8", "train.micro_batch=2"]
#: name -> (processes, overrides); a new layout is one more entry
LAYOUTS = {
    "fsdp-2": (2, ["parallel.backend=fsdp"]),
    "fsdp-4": (4, ["parallel.backend=fsdp"]),
    "hsdp-2x2": (4, ["parallel.backend=fsdp", "parallel.dp_replicate=2", "parallel.dp_shard=2"]),
    "zero3-2": (2, ["parallel.backend=deepspeed", "parallel.zero_stage=3"]),
}


def initial_state(out: Path, nproc: int, overrides: list[str]) -> dict:
    """{"tensors": {"variant/name": full tensor}, "no_decay": {variant: names}} at step 0 on this layout."""
    args = [WORKER, str(out), ",".join(VARIANTS), *BASE, *overrides]
    launch = [PY] if nproc == 1 else [PY, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                                       "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    proc = subprocess.run([*launch, *args], cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    return initial_state(tmp_path_factory.mktemp("init") / "one.pt", 1, [])


def test_one_process_matches_a_whole_cpu_build(one_process):
    for variant in VARIANTS:
        cfg: Config = build(Config, apply_overrides({}, [*BASE, f"model.variant={variant}"]))
        whole = build_model(cfg.model, seed=cfg.train.seed)
        for name, t in [*whole.named_parameters(), *whole.named_buffers()]:
            assert torch.equal(one_process["tensors"][f"{variant}/{name}"], t), f"{variant}/{name}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_initial_state_is_bitwise_the_same_on_every_layout(tmp_path, one_process, layout):
    nproc, overrides = LAYOUTS[layout]
    got = initial_state(tmp_path / f"{layout}.pt", nproc, overrides)
    state, ref = got["tensors"], one_process["tensors"]
    assert state.keys() == ref.keys()
    differ = [k for k in state if state[k].dtype != ref[k].dtype or not torch.equal(state[k], ref[k])]
    assert not differ, f"{layout}: {len(differ)} tensors differ from one process, e.g. {differ[:3]}"
    assert got["no_decay"] == one_process["no_decay"]  # the same parameters decayed, however they are held

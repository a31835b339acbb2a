"""The initial weights do not depend on the world size, the sharding or the backend: the full state gathered
at step 0 is bitwise the same for one process, FSDP2 on 2 and 4 ranks, HSDP 2 x 2 and ZeRO-3 on 2 ranks (gloo),
and the same as a model built whole on the CPU from the same seed; so are the names excluded from weight
decay. One launch per world size (2 ranks: FSDP2 and ZeRO-3; 4 ranks: FSDP2 and HSDP), every layout of it in
turn in the same ranks, four variants in each: the ranks srun-style, forked by the tests' fork server
(tests/distributed/rankutil.py; what is tested is the state they build, not the launcher, and a launch per layout
cost a quarter more); the one process is this one. Runtime: about 20 CPU seconds."""

from __future__ import annotations

import json

import pytest
import torch

from distributed.init_state_worker import initial_state as one_process_state
from distributed.rankutil import run_ranks
from rrtrain.config import Config
from rrtrain.config_load import apply_overrides, build
from rrtrain.core.dist import DistInfo
from rrtrain.resolve import build_model

pytestmark = pytest.mark.distributed

WORKER = "tests.distributed.init_state_worker"
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


@pytest.fixture(scope="module")
def layout_states(tmp_path_factory) -> dict[str, dict]:
    """{layout: {"tensors": {"variant/name": full tensor}, "no_decay": {variant: names}}} at step 0: one launch
    per world size, its layouts in turn."""
    out = tmp_path_factory.mktemp("layouts")
    for nproc in sorted({n for n, _ in LAYOUTS.values()}):
        layouts = {name: [*BASE, *over] for name, (n, over) in LAYOUTS.items() if n == nproc}
        (out / f"layouts{nproc}.json").write_text(json.dumps(layouts))
        proc = run_ranks(WORKER, [str(out), ",".join(VARIANTS), str(out / f"layouts{nproc}.json")], nproc)
        assert proc.returncode == 0, proc.stderr[-5000:]
    return {name: torch.load(out / f"{name}.pt") for name in LAYOUTS}


@pytest.fixture(scope="module")
def one_process() -> dict:
    """The worker's state in this process, with no process group (parallel.backend none)."""
    return one_process_state(VARIANTS, BASE, DistInfo(0, 1, 0, torch.device("cpu")))


def test_one_process_matches_a_whole_cpu_build(one_process):
    for variant in VARIANTS:
        cfg: Config = build(Config, apply_overrides({}, [*BASE, f"model.variant={variant}"]))
        whole = build_model(cfg.model, seed=cfg.train.seed)
        for name, t in [*whole.named_parameters(), *whole.named_buffers()]:
            assert torch.equal(one_process["tensors"][f"{variant}/{name}"], t), f"{variant}/{name}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_initial_state_is_bitwise_the_same_on_every_layout(layout_states, one_process, layout):
    got = layout_states[layout]
    state, ref = got["tensors"], one_process["tensors"]
    assert state.keys() == ref.keys()
    differ = [k for k in state if state[k].dtype != ref[k].dtype or not torch.equal(state[k], ref[k])]
    assert not differ, f"{layout}: {len(differ)} tensors differ from one process, e.g. {differ[:3]}"
    assert got["no_decay"] == one_process["no_decay"]  # the same parameters decayed, however they are held

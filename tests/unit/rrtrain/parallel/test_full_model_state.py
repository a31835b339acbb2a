"""`Engine.full_model_state` / `load_model_state` (issue 46): the engines' own consolidation of the weights, the
unwrapped model's names, fp32 on the CPU; and a warm start's way in. The local engine in-process (under 1 s);
DeepSpeed ZeRO-2 in one process (its import alone is seconds: slow)."""

from __future__ import annotations

import os

import pytest
import torch

from rrtrain.config import Config, ModelConfig
from rrtrain.core.dist import DistInfo
from rrtrain.parallel import build_engine
from rrtrain.resolve import build_model


def tiny(backend: str = "none") -> Config:
    cfg = Config()
    cfg.model = ModelConfig(size="tiny", variant="review", d_model=32, n_layers=1, n_heads=4, d_ff=64, seq_len=8,
                            vocab_size=64)
    cfg.train.compile = False
    cfg.train.global_batch = cfg.train.micro_batch = 2
    cfg.parallel.backend = backend
    return cfg


def check_round_trip(engine) -> None:
    own = {k: v.detach().float().cpu() for k, v in engine.inner.state_dict().items()}
    state = engine.full_model_state()
    assert state.keys() == own.keys()
    for k in own:
        assert state[k].device.type == "cpu" and state[k].dtype == torch.float32
        assert torch.equal(state[k], own[k]), k
    moved = {k: v + 0.01 for k, v in state.items()}
    engine.load_model_state(moved)
    again = engine.full_model_state()
    assert all(torch.equal(again[k], moved[k]) for k in moved)


def test_local_engine_consolidates_and_loads_its_weights():
    torch.manual_seed(0)
    cfg = tiny()
    engine = build_engine(build_model(cfg.model), cfg, DistInfo(0, 1, 0, torch.device("cpu")))
    check_round_trip(engine)
    idx = torch.randint(0, 64, (2, 9))
    assert torch.isfinite(engine.forward(idx[:, :-1], idx[:, 1:]))


@pytest.mark.slow
def test_deepspeed_engine_consolidates_its_fp32_masters():
    environ = dict(os.environ)
    pytest.importorskip("deepspeed")
    torch.manual_seed(0)
    cfg = tiny("deepspeed")
    cfg.parallel.zero_stage = 2
    started = not torch.distributed.is_initialized()
    try:
        engine = build_engine(build_model(cfg.model), cfg, DistInfo(0, 1, 0, torch.device("cpu")))
        check_round_trip(engine)
    finally:  # DeepSpeed starts a process group in this process and sets LOCAL_RANK (and more, its import too)
        # in its environment: the worker's next tests must find neither (tests/conftest.py checks the variables)
        if started and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)

"""Asynchronous checkpoints on the real engine and real DCP files, in one process: the write holds the state of
the step it was started at although training goes on while it waits, nothing is published (no `latest`, no
`step_*` directory) until `finish`, and a second save cannot start while one is in flight. DCP's file writer
is held back by an event so that the optimizer step surely lands before the write. Runtime: about 2 s."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _FileSystemWriter

from rrtrain.training.checkpoint import CheckpointManager
from rrtrain.config import Config, ModelConfig
from rrtrain.core.dist import DistInfo
from rrtrain.resolve import build_model
from rrtrain.parallel import build_engine
from trainutil import train_state

INFO = DistInfo(0, 1, 0, torch.device("cpu"))


def tiny_engine(seed: int):
    torch.manual_seed(seed)
    cfg = Config()
    cfg.model = ModelConfig(size="tiny", variant="review", d_model=32, n_layers=1, n_heads=4, d_ff=64, seq_len=8,
                            vocab_size=64)
    cfg.train.compile = False  # the default's token budget would compile the blocks: not under test here
    return build_engine(build_model(cfg.model), cfg, INFO)


def train_step(engine, seed: int) -> None:
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(seed))
    engine.backward(engine.forward(idx[:, :-1], idx[:, 1:]), last_micro=True)
    engine.clip_grad_norm(1.0)
    engine.step(1e-2)


def snapshot(engine) -> dict[str, torch.Tensor]:
    """Every parameter and every AdamW tensor (moments, step count), by parameter name."""
    out = {}
    for name, p in engine.model.named_parameters():
        out[name] = p.detach().clone()
        out.update({f"{name}.{k}": v.detach().clone() for k, v in engine.optimizer.state[p].items()})
    return out


@pytest.fixture
def held_writer(monkeypatch):
    """DCP's file writer waits for the returned event before it writes anything."""
    go = threading.Event()
    write_data = _FileSystemWriter.write_data

    def held(self, plan, planner):
        assert go.wait(60), "the test never let the write go"
        return write_data(self, plan, planner)

    monkeypatch.setattr(_FileSystemWriter, "write_data", held)
    yield go
    go.set()


def test_async_save_writes_its_step_and_publishes_only_when_finished(tmp_path, held_writer):
    engine = tiny_engine(0)
    train_step(engine, 1)  # moments and step counts exist
    mgr = CheckpointManager(tmp_path, keep=2, info=INFO, asynchronous=True)
    saved = snapshot(engine)
    mgr.start(engine, 1, train_state(1))
    train_step(engine, 2)  # changes every weight and moment while the write waits
    moved = snapshot(engine)
    assert not torch.equal(moved["tok_emb.weight"], saved["tok_emb.weight"])

    root = tmp_path / "checkpoints"
    assert mgr.writing() and mgr.in_flight.step == 1
    assert sorted(p.name for p in root.iterdir()) == [".rrtrain-key", ".tmp_step_00000001"]  # nothing published, no latest
    assert mgr.latest() is None  # what a resume would see now: no checkpoint
    with pytest.raises(RuntimeError, match="step 1 is still in flight"):
        mgr.start(engine, 2, train_state(2))  # at most one save in flight
    with pytest.raises(RuntimeError, match="step 1 is still in flight"):
        mgr.save(engine, 2, train_state(2))

    held_writer.set()
    done = mgr.finish()
    assert done is not None and done.step == 1 and done.path == root / "step_00000001"
    assert not mgr.writing() and mgr.in_flight is None and mgr.finish() is None
    assert (root / "latest").read_text() == "step_00000001\n"
    assert sorted(p.name for p in root.iterdir()) == [".rrtrain-key", "latest", "step_00000001"]
    assert mgr.latest() == done.path  # every file matches the checksums hashed after the write
    assert mgr.read_train_state(done.path)["step"] == 1

    fresh = tiny_engine(1)
    mgr.load(fresh, done.path)
    restored = snapshot(fresh)
    assert restored.keys() == saved.keys()
    for key in saved:
        assert torch.equal(restored[key], saved[key]), key  # the state when the save started, not after

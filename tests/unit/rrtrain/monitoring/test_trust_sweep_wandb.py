"""The W&B run id includes the run's own start: a fresh run in a reused directory (no checkpoint) is a new W&B
run, never the old curve; a resume continues its own id, kept in the checkpoint (the callback's state); a
checkpoint of an older rrtrain (no id kept) resumes the directory's id. W&B itself is a recording stand-in for
`wandb.init` (the real offline runs: tests/e2e/test_wandb_logger.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import pytest

from rrtrain.config import Config, WandbConfig
from rrtrain.monitoring.wandb_logger import WandbLogger, wandb_run_id


@pytest.fixture
def inits(monkeypatch):
    """The ids `wandb.init` is asked for."""
    wandb = pytest.importorskip("wandb")
    asked: list[str] = []

    def init(id: str, **kwargs):  # noqa: A002 - wandb's own keyword
        asked.append(id)
        return SimpleNamespace(id=id, step=0, resumed=False, config=SimpleNamespace(update=lambda *a, **k: None))

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setattr(wandb, "setup", lambda settings=None: None)  # no service process (setup_in's call)
    return asked


def start(run_dir, resumed_at: Optional[int], state: Optional[dict] = None) -> WandbLogger:
    """A WandbLogger through `on_start` as the trainer drives it: the checkpoint's state first, when resuming."""
    run_dir.mkdir(exist_ok=True)  # the trainer's, made before the callbacks start
    logger = WandbLogger(WandbConfig(mode="offline"))
    if state is not None:
        logger.load_state_dict(state)
    facts = SimpleNamespace(is_main=True, run_dir=run_dir, config=Config(), params=1, tokens_per_step=1,
                            warmup_steps=0, world_size=1, accum=1)
    logger.on_start(SimpleNamespace(facts=facts, total_steps=8, resumed_at=resumed_at))
    assert logger.run is not None, "the stand-in W&B did not start"
    return logger


def test_a_fresh_run_in_a_reused_directory_is_a_new_wandb_run(tmp_path, inits):
    run = tmp_path / "tiny-review-s0"
    first = start(run, None)
    again = start(run, None)  # the same directory, started from scratch (no checkpoint): other settings, say
    assert inits[0] != inits[1]
    assert all(i.startswith(wandb_run_id(run) + "-") for i in inits)  # still the directory's, for the eye
    assert first.state_dict() == {"run_id": inits[0]} and again.state_dict() == {"run_id": inits[1]}


def test_a_resume_continues_its_own_wandb_run(tmp_path, inits):
    run = tmp_path / "tiny-review-s0"
    first = start(run, None)
    resumed = start(run, 8, state=first.state_dict())  # the state a checkpoint of the first start holds
    assert inits == [inits[0], inits[0]] and resumed.state_dict() == first.state_dict()


def test_a_checkpoint_without_an_id_resumes_the_directorys(tmp_path, inits):
    start(tmp_path / "r", 8, state={})  # written by an older rrtrain: its W&B run had the directory's id
    assert inits == [wandb_run_id(tmp_path / "r")]


@pytest.mark.parametrize("bad", [5, "a/b", "", "x" * 129, ["id"]])
def test_a_kept_id_that_is_no_wandb_id_is_refused(bad):
    with pytest.raises(ValueError, match="not a W&B run id"):
        WandbLogger(WandbConfig(mode="offline")).load_state_dict({"run_id": bad})

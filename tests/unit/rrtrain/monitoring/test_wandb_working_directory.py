"""W&B reads a workspace settings file (`wandb/settings`) from the working directory as it sets up, before the
run's own `dir=` counts: a run started in a shared directory read a co-tenant's file, whose `base_url` sent the
user's API key and the run to their server. The run sets W&B up in its own directory (`setup_in`). WANDB_DIR,
where W&B keeps the run's files, must be the user's alone, as the compile and tiktoken caches are."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from rrtrain.config import WandbConfig, load_config
from rrtrain.core.errors import UsageError

wandb = pytest.importorskip("wandb")

from rrtrain.monitoring.wandb_logger import WandbLogger  # noqa: E402

PLANTED = "http://planted.invalid:9999"


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """A working directory holding another user's W&B settings; W&B disabled (no service process, no network)."""
    where = tmp_path / "shared"
    (where / "wandb").mkdir(parents=True)
    (where / "wandb" / "settings").write_text(f"[default]\nbase_url = {PLANTED}\n")
    monkeypatch.chdir(where)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    wandb.teardown()  # a singleton another test of this process left
    yield where
    wandb.teardown()


def test_w_and_b_itself_reads_the_working_directorys_settings(shared):
    assert wandb.setup().settings.base_url == PLANTED  # what a plain wandb.init() in that directory gets


def test_a_run_sets_w_and_b_up_in_its_own_directory(shared, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    facts = SimpleNamespace(is_main=True, run_dir=str(run), config=load_config(None), params=1, tokens_per_step=1,
                            warmup_steps=0, world_size=1, accum=1)
    WandbLogger(WandbConfig(mode="disabled")).on_start(SimpleNamespace(facts=facts, resumed_at=None, total_steps=2))
    settings = wandb.setup().settings  # the singleton the run made: nothing is read again
    assert settings.base_url != PLANTED and settings.base_url.startswith("https://")
    assert os.getcwd() == str(shared)


def test_a_wandb_dir_someone_else_can_write_is_refused_in_one_line(tmp_path, monkeypatch):
    """A co-tenant's 0777 directory as WANDB_DIR: W&B wrote the run's files and its `latest-run` link there."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("WANDB_DIR", str(shared / "wandb-files"))
    with pytest.raises(UsageError, match="WANDB_DIR") as got:
        WandbLogger(WandbConfig(mode="disabled"))
    assert "\n" not in str(got.value) and not (shared / "wandb-files").exists()
    own = tmp_path / "own" / "wandb-files"
    monkeypatch.setenv("WANDB_DIR", str(own))
    WandbLogger(WandbConfig(mode="disabled"))
    assert own.is_dir() and own.stat().st_mode & 0o777 == 0o700

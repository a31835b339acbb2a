"""Names and numbers: every value that reaches a file name or a rendered script matches its pattern in full
(a trailing newline is refused); non-finite numbers are refused wherever a finite one is meant (one line
naming the key); `data.eval_batches` >= 1; JSON files never hold a bare NaN or Infinity (final.json records a
non-finite loss as null and says why; train_state.json keeps them exactly in a JSON spelling).
Budget: config and spec checks in this process, two refused CLI starts and one 2-step run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from launchers.sweep import spec
from launchers.sweep.expand import check_safe
from launchers.executors.render import sbatch_lines
from launchers.sweep.spec import Resources
from rrtrain.config import load_config
from rrtrain.core.errors import UsageError
from trainutil import TINY, train


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise AssertionError(f"bare {name} in JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("text", ["x\n", "debug\n", "a\nb", "\n", "x\r", ""])
def test_a_name_with_a_newline_is_refused_in_full(text):
    with pytest.raises(UsageError, match="unsafe in a job script"):
        check_safe(text, "partition")


def test_a_partition_ending_in_a_newline_never_reaches_a_script():
    with pytest.raises(UsageError, match="partition 'debug\\\\n'"):
        sbatch_lines(Resources(partition="debug\n"), "job", "/tmp/out", None)


def _sweep(tmp_path: Path, **changes) -> Path:
    body = {"name": "t", "config": "tiny.yaml", "data": "/data/x", "variants": ["review"], "sizes": {"tiny": 1},
            **changes}
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(body, sort_keys=False))
    return p


def test_a_sweep_named_with_a_newline_is_refused_before_anything_is_written(tmp_path, capsys):
    """`rrtrain sweep` in this process (the command's main)."""
    from rrtrain.cli.main import main

    assert main(["sweep", str(_sweep(tmp_path, name="x\n")), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "sweep name 'x\\n'" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_non_finite_resource_is_refused_naming_the_key(tmp_path, value):
    p = tmp_path / "sweep.yaml"
    p.write_text(_sweep(tmp_path).read_text() + f"resources:\n  mem_gb: {value}\n")
    with pytest.raises(UsageError, match=r"resources\.mem_gb: expected a finite number") as err:
        spec.load(p)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("override, key", [
    ("model.init_std=inf", "model.init_std"), ("train.lr=nan", "train.lr"), ("train.lr=1e999", "train.lr"),
    ("monitor.spike_sigma=-inf", "monitor.spike_sigma"), ("match.tolerance=NaN", "match.tolerance"),
])
def test_non_finite_config_values_are_refused_naming_the_key(override, key):
    with pytest.raises(UsageError, match=rf"{key}: expected a finite number"):
        load_config(TINY, [override])


def test_non_finite_values_in_yaml_are_refused(tmp_path):
    cfg = yaml.safe_load(Path(TINY).read_text())
    cfg["train"]["lr"] = float("nan")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(UsageError, match="train.lr: expected a finite number"):
        load_config(p)


def test_eval_batches_must_be_at_least_one():
    with pytest.raises(UsageError, match="data.eval_batches must be positive, got 0"):
        load_config(TINY, ["data.eval_batches=0"])


def test_an_evaluation_that_ran_no_batch_is_never_a_loss():
    """eval_batches >= 1 keeps it from happening; should a rank's list still come back empty, the evaluation
    is no loss (NaN, with a note for final.json), never 0.0, and the best loss is left as it was."""
    from types import SimpleNamespace

    import torch

    from rrtrain.training.trainer import Trainer

    trainer = Trainer.__new__(Trainer)  # only what evaluate() reads: no run directory, no model
    trainer.info, trainer.val_batches, trainer.val_sources = SimpleNamespace(device=torch.device("cpu")), [], []
    trainer.best_val = 4.0
    assert math.isnan(trainer.evaluate())
    assert math.isnan(trainer.last_val) and trainer.last_val_note == "no evaluation batch ran"
    assert trainer.best_val == 4.0


def test_the_cli_refuses_inf_init_std_in_one_line(tmp_path, capsys):
    """`rrtrain train` in this process (the command's main)."""
    from rrtrain.cli.main import main

    assert main(["train", TINY, "model.init_std=inf", f"run.dir={tmp_path / 'r'}"]) == 2
    assert capsys.readouterr().err.strip() == "rrtrain train: error: model.init_std: expected a finite number, got 'inf'"
    assert not (tmp_path / "r").exists()


def test_json_files_never_hold_bare_nan(tmp_path):
    from rrtrain.core.io import atomic_write_json

    atomic_write_json(tmp_path / "a.json", {"loss": math.nan, "best": [math.inf, 1.5], "n": -math.inf})
    assert _strict((tmp_path / "a.json").read_text()) == {"loss": None, "best": [None, 1.5], "n": None}


def test_train_state_keeps_non_finite_numbers_exactly(tmp_path):
    from rrtrain.core.io import atomic_write_json
    from rrtrain.rundir import train_state
    from rrtrain.training.checkpoint import TRAIN_STATE, CheckpointManager

    state = {"step": 3, "tokens": 96, "skipped": 0, "wall_s": 1.0, "last_val_loss": None, "world_size": 1,
             "config": {}, "loader": {"samples_consumed": 6}, "files": {},
             "best_val_loss": math.inf, "callbacks": {"monitor": {"low": -math.inf, "x": [math.nan, 2.0]}}}
    atomic_write_json(tmp_path / TRAIN_STATE, train_state.encode(state))
    _strict((tmp_path / TRAIN_STATE).read_text())
    back = CheckpointManager.read_train_state(tmp_path)
    assert back["best_val_loss"] == math.inf and back["callbacks"]["monitor"]["low"] == -math.inf
    assert math.isnan(back["callbacks"]["monitor"]["x"][0]) and back["callbacks"]["monitor"]["x"][1] == 2.0


@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_a_non_finite_loss_is_null_in_final_json_with_the_reason(stories_data, tmp_path):
    """A learning rate that blows the model up: every loss is NaN, and final.json stays JSON."""
    run_dir = tmp_path / "run"
    train(run_dir, stories_data, "train.max_steps=2", "train.eval_every=1", "data.eval_batches=1", "train.lr=1e6",
          "train.warmup_steps=0", "train.grad_clip=0")
    final = _strict((run_dir / "final.json").read_text())
    assert final["final_val_loss"] is None
    assert final["final_val_loss_note"] == "the last evaluation's loss was nan"
    ckpt = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    _strict((ckpt / "train_state.json").read_text())

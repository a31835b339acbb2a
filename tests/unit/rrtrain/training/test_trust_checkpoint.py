"""The checkpoint trust boundary: a checkpoint without its files manifest is refused unless the user opts in
(`train.allow_unverified_checkpoint`), and a checkpoint whose pickled parts would run code is refused without
running it, even when its manifest was rewritten to match (DCP's `.metadata`, a DCP byte item, DeepSpeed's
`.pt` files). Each crafted pickle would create a marker file; the tests check that it did not.
Budget: two 2-step runs (DCP and DeepSpeed) and four short resumes, about 1 min."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from trainutil import train

STEPS = ["train.max_steps=2", "train.eval_every=0", "train.log_every=1", "data.eval_batches=1"]
MORE = ["train.max_steps=3", "train.allow_config_change=true"]  # resume: one step beyond the checkpoint


class RunsCommand:
    """Unpickling this runs a shell command (what a hostile checkpoint file would carry)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (self.command,))


def _checkpoint(run_dir: Path) -> Path:
    root = run_dir / "checkpoints"
    return root / (root / "latest").read_text().strip()


def _rewrite_manifest(ckpt: Path) -> None:
    """What a writer who can edit the run directory does: record the hashes of the files as they now are."""
    from rrtrain.training.checkpoint import TRAIN_STATE, checksum_files

    state = json.loads((ckpt / TRAIN_STATE).read_text())
    files = checksum_files(ckpt, 0, 1)
    files.pop(TRAIN_STATE)
    state["files"] = files
    (ckpt / TRAIN_STATE).write_text(json.dumps(state))


@pytest.fixture(scope="module")
def dcp_run(stories_data, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("dcp") / "run"
    train(run_dir, stories_data, *STEPS)
    return run_dir


@pytest.fixture
def copy_of(tmp_path):
    def make(run_dir: Path) -> Path:
        dst = tmp_path / "run"
        shutil.copytree(run_dir, dst)
        (dst / "final.json").unlink()
        return dst
    return make


@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_checkpoint_without_manifest_is_refused_unless_allowed(dcp_run, copy_of, stories_data):
    run_dir = copy_of(dcp_run)
    ckpt = _checkpoint(run_dir)
    state = json.loads((ckpt / "train_state.json").read_text())
    del state["files"]
    (ckpt / "train_state.json").write_text(json.dumps(state))
    refused = train(run_dir, stories_data, *STEPS, *MORE, expect=2)
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "no files manifest" in lines[0] and "train.allow_unverified_checkpoint" in lines[0], \
        refused.stderr
    train(run_dir, stories_data, *STEPS, *MORE, "train.allow_unverified_checkpoint=true")
    assert json.loads((run_dir / "final.json").read_text())["step"] == 3


@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_crafted_dcp_metadata_is_refused_and_runs_nothing(dcp_run, copy_of, stories_data, tmp_path):
    run_dir = copy_of(dcp_run)
    ckpt = _checkpoint(run_dir)
    marker = tmp_path / "ran"
    (ckpt / "state" / ".metadata").write_bytes(pickle.dumps(RunsCommand(f"touch {marker}")))
    _rewrite_manifest(ckpt)
    proc = train(run_dir, stories_data, *STEPS, *MORE, expect=2)
    assert not marker.exists(), "the crafted .metadata ran its command"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ".metadata was refused" in lines[0] and "posix.system" in lines[0], proc.stderr
    # and the same with no manifest at all, the user having opted in: the restricted reader still refuses
    state = json.loads((ckpt / "train_state.json").read_text())
    del state["files"]
    (ckpt / "train_state.json").write_text(json.dumps(state))
    train(run_dir, stories_data, *STEPS, *MORE, "train.allow_unverified_checkpoint=true", expect=2)
    assert not marker.exists()


@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_dcp_metadata_reader_admits_real_metadata_only(dcp_run, tmp_path):
    from rrtrain.core.errors import UsageError
    from rrtrain.parallel.safe_load import read_metadata

    meta = read_metadata(_checkpoint(dcp_run) / "state")
    assert any(k.startswith("model.") for k in meta.state_dict_metadata)
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(UsageError, match="not DCP metadata"):
        read_metadata(tmp_path)
    (tmp_path / ".metadata").write_bytes(b"\x80\x05garbage")
    with pytest.raises(UsageError, match="was refused"):
        read_metadata(tmp_path)


def test_dcp_byte_items_are_read_weights_only(tmp_path):
    """DCP's own planner unpickles non-tensor items (the optimizer's param_groups) with weights_only=False."""
    from types import SimpleNamespace

    from rrtrain.core.errors import UsageError
    from rrtrain.parallel.safe_load import WeightsOnlyLoadPlanner

    planner = WeightsOnlyLoadPlanner(flatten_state_dict=False)
    planner.state_dict = {}
    item = SimpleNamespace(dest_index=SimpleNamespace(fqn="optim.param_groups"))
    plain = io.BytesIO()
    torch.save([{"lr": 0.1, "betas": (0.9, 0.95)}], plain)
    plain.seek(0)
    planner.load_bytes(item, plain)
    assert planner.state_dict["optim.param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.95)}]
    marker = tmp_path / "ran"
    hostile = io.BytesIO()
    torch.save(RunsCommand(f"touch {marker}"), hostile)
    hostile.seek(0)
    with pytest.raises(UsageError, match="item optim.param_groups was refused"):
        planner.load_bytes(item, hostile)
    assert not marker.exists()


@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_crafted_deepspeed_file_is_refused_and_runs_nothing(stories_data, tmp_path):
    """The real DeepSpeed path (DS_ACCELERATOR=cpu, as rrtrain sets it without CUDA): a checkpoint whose
    optimizer file would run a command is refused. (Intact DeepSpeed checkpoints resume exactly through the
    same weights-only engine: tests/distributed/test_deepspeed.py.)"""
    run_dir = tmp_path / "ds"
    ds = ["parallel.backend=deepspeed", "parallel.zero_stage=2"]
    train(run_dir, stories_data, *STEPS, *ds)
    (run_dir / "final.json").unlink()
    ckpt = _checkpoint(run_dir)
    marker = tmp_path / "ran"
    optim = next((ckpt / "state" / "zero").glob("*optim_states.pt"))
    saved = torch.load(optim, weights_only=False)  # the test's own file: trusted here
    saved["hostile"] = RunsCommand(f"touch {marker}")
    torch.save(saved, optim)
    _rewrite_manifest(ckpt)
    proc = train(run_dir, stories_data, *STEPS, *MORE, *ds, expect=2)
    assert not marker.exists(), "the crafted DeepSpeed file ran its command"
    assert "optim_states.pt was refused" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

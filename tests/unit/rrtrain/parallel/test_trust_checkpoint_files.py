"""A checkpoint's files are opened by rrtrain's file layer, never by torch from a path
(rrtrain/parallel/safe_load.py): DCP's data files beneath the checkpoint, the RNG files, DeepSpeed's. A FIFO
in place of one, left out of the manifest so that the integrity check passes it by (or with
`train.allow_unverified_checkpoint`), is one line, exit 2, within a bounded time from `rrtrain eval`,
`rrtrain export` and a resume (before, torch opened it and hung); a damaged file whose manifest was rewritten
to match is one line, exit 2, never torch's traceback. Budget: one 2-step run, three refused resumes, one
`rrtrain eval` subprocess refused after the model is built, `rrtrain export` in this process: about 20 s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from evalutil import write_tasks
from faultutil import unblocked
from rrtrain.cli.main import main as cli
from rrtrain.core.errors import UsageError
from trainutil import PY, env, run_cmd, train

SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "train.max_steps=2", "train.global_batch=4",
         "train.micro_batch=4", "train.warmup_steps=1", "train.compile=false", "train.eval_every=0",
         "data.eval_batches=1", "train.log_every=1"]
MORE = ["train.max_steps=3", "train.allow_config_change=true"]  # a resume: one step beyond the checkpoint
DATA_FILE = "state/__0_0.distcp"
#: a bound no refusal comes near (an interpreter's start-up, torch's import and the model's build)
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def trained(stories_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    train(run_dir, stories_data, *SMALL)
    return run_dir


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(trained, dst, symlinks=True)
    (dst / "final.json").unlink()
    # eval and export read the checkpoint, as for a run from before model artifacts (rrtrain/training/artifact.py)
    shutil.rmtree(dst / "artifact", ignore_errors=True)
    return dst


def checkpoint(run_dir: Path) -> Path:
    root = run_dir / "checkpoints"
    return root / (root / "latest").read_text().strip()


def manifest(ckpt: Path, drop: str = "", rehash: str = "") -> None:
    """What a writer of the run directory can do: leave `drop` out of the manifest, or record `rehash` as it now is."""
    from rrtrain.training.checkpoint import TRAIN_STATE, checksum_files

    state = json.loads((ckpt / TRAIN_STATE).read_text())
    if drop:
        del state["files"][drop]
    if rehash:
        state["files"][rehash] = checksum_files(ckpt, 0, 1)[rehash]
    (ckpt / TRAIN_STATE).write_text(json.dumps(state))


def fifo_in_place_of(ckpt: Path, rel: str) -> None:
    (ckpt / rel).unlink()
    os.mkfifo(ckpt / rel)
    manifest(ckpt, drop=rel)


def one_line(result: subprocess.CompletedProcess, *words: str) -> str:
    err = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in err and "Traceback" not in err, (result.returncode, err)
    assert all(w in err for w in words), err
    return err


def bounded(call: Callable[[], Any], fifo: Path) -> Any:
    """`call()` given TIMEOUT_S: torch blocked on `fifo` before the fix."""
    return unblocked(call, [fifo], TIMEOUT_S)


def command(*argv: str) -> subprocess.CompletedProcess:
    """`python -m rrtrain ARGV` in a process of its own: forked by the tests' fork server where one serves
    (trainutil.run_cmd), its imports paid once per pytest process."""
    return run_cmd([PY, "-m", "rrtrain", *argv], env(), TIMEOUT_S, module="rrtrain")


@pytest.mark.slow  # trains in a subprocess
def test_a_fifo_among_the_data_files_is_one_line_from_eval_export_and_resume(run: Path, stories_data: Path,
                                                                              tmp_path: Path, capsys) -> None:
    ckpt = checkpoint(run)
    fifo_in_place_of(ckpt, DATA_FILE)
    tasks = write_tasks(tmp_path / "tasks")
    one_line(command("eval", str(run), "--tasks", "tiny_mc", "--include", str(tasks), "--limit", "1"),
             "__0_0.distcp", "not a regular file")
    assert bounded(lambda: cli(["export", str(run), "--hf", str(tmp_path / "hf")]), ckpt / DATA_FILE) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rrtrain export: error: ") and "\n" not in err and "__0_0.distcp" in err, err
    assert not (tmp_path / "hf").exists()
    one_line(train(run, stories_data, *SMALL, *MORE, expect=None, timeout=TIMEOUT_S), "__0_0.distcp",
             "not a regular file")


@pytest.mark.slow  # trains in a subprocess
def test_a_fifo_as_the_rng_file_is_one_line_from_resume(run: Path, stories_data: Path) -> None:
    fifo_in_place_of(checkpoint(run), "rng_rank0.pt")
    one_line(train(run, stories_data, *SMALL, *MORE, expect=None, timeout=TIMEOUT_S), "rng_rank0.pt",
             "not a regular file")


@pytest.mark.slow  # trains in a subprocess
def test_a_damaged_data_file_is_one_line(run: Path, stories_data: Path) -> None:
    from rrtrain.artifact import load_run

    ckpt = checkpoint(run)
    data = (ckpt / DATA_FILE).read_bytes()
    (ckpt / DATA_FILE).write_bytes(data[:64])  # truncated, and its manifest made to match
    manifest(ckpt, rehash=DATA_FILE)
    with pytest.raises(UsageError, match=r"__0_0.distcp cannot be read \(") as got:
        load_run(run)  # what eval and export load through
    assert "\n" not in str(got.value)
    one_line(train(run, stories_data, *SMALL, *MORE, expect=None, timeout=TIMEOUT_S), "__0_0.distcp",
             "cannot be read")


def test_a_data_file_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    """DCP's metadata (untrusted: anyone who can write the run directory rewrites it) names each data file; one
    that leads out of the checkpoint directory, or is a link, is never opened."""
    from rrtrain.parallel.safe_load import BeneathFileSystem

    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "theirs.distcp").write_bytes(b"someone else's")
    (state / "linked.distcp").symlink_to(tmp_path / "theirs.distcp")
    (state / "mine.distcp").write_bytes(b"mine")
    fs = BeneathFileSystem(state)
    with fs.create_stream(fs.concat_path(state, "mine.distcp"), "rb") as stream:
        assert stream.read() == b"mine"
    for name in ("../theirs.distcp", str(tmp_path / "theirs.distcp"), "linked.distcp", "/dev/zero"):
        with pytest.raises(UsageError, match="cannot be read"):
            with fs.create_stream(fs.concat_path(state, name), "rb"):
                pass


def test_a_deepspeed_file_is_opened_by_the_layer(tmp_path: Path) -> None:
    """DeepSpeed's loader (and zero_to_fp32) hand torch a path: rrtrain's weights-only load opens it itself (a
    link there is refused, where torch would follow it), and a DeepSpeed checkpoint directory holding a link or a
    FIFO is refused before DeepSpeed looks into it."""
    import torch

    from rrtrain.parallel.safe_load import check_tree, weights_only

    zero = tmp_path / "state" / "zero"
    zero.mkdir(parents=True)
    states = zero / "mp_rank_00_model_states.pt"
    torch.save({"w": torch.ones(2)}, states)
    assert weights_only(str(states), str(states))["w"].sum() == 2
    check_tree(tmp_path / "state")
    torch.save({"w": torch.zeros(2)}, tmp_path / "theirs.pt")
    (zero / "linked_optim_states.pt").symlink_to(tmp_path / "theirs.pt")
    with pytest.raises(UsageError, match="linked_optim_states.pt cannot be read"):
        weights_only(str(zero / "linked_optim_states.pt"), str(zero / "linked_optim_states.pt"))
    with pytest.raises(UsageError, match="linked_optim_states.pt cannot be read .*symbolic link"):
        check_tree(tmp_path / "state")
    (zero / "linked_optim_states.pt").unlink()
    os.mkfifo(zero / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(UsageError, match="optim_states.pt cannot be read .*not a regular file"):
        check_tree(tmp_path / "state")
    (zero / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    states.write_bytes(states.read_bytes()[:100])  # truncated
    with pytest.raises(UsageError, match="model_states.pt cannot be read"):
        weights_only(str(states), str(states))


def test_an_io_error_is_a_run_failure_and_a_file_at_fault_is_bad_input() -> None:
    """The documented codes: exit 1 (the run `failed`) when the machine cannot read a file, 2 when the file is
    at fault."""
    import errno

    from rrtrain.core import files
    from rrtrain.core.errors import RunError
    from rrtrain.parallel.safe_load import damaged

    assert isinstance(damaged("f", OSError(errno.EIO, "Input/output error")), RunError)
    for err in (files.NotRegular(0, "not a regular file"), files.LinkRefused(errno.ELOOP, "a symbolic link"),
                FileNotFoundError(errno.ENOENT, "No such file or directory"), EOFError(),
                RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory")):
        got = damaged("f", err)
        assert isinstance(got, UsageError) and "\n" not in str(got), got

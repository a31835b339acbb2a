"""Nothing already written is lost: `rrtrain prep --overwrite` replaces only an empty directory or a dataset,
never the working directory, a parent of it or a home; new datasets are the user's alone; a resume refused
before training never rewrites final.json, an ending for good is never replaced by a later failure, and a
garbage line in metrics.jsonl neither fails a finished run nor blocks its resumes.
Budget: a few tiny preps in this process and one 2-step run with three short restarts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from prep_helpers import prep
from rrtrain.rundir.outcome import keeps_recorded
from trainutil import train, train_cmd
from unit.rrtrain.training.test_callbacks_user import run_from

PREP = ["--source", "synthetic:stories", "--num-docs", "30", "--seq-len", "32", "--min-val-samples", "4"]


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _refused(capsys, out: str | Path, expect: str) -> None:
    code = prep(*PREP, "--out", str(out), "--overwrite")
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and expect in err, err


def _fake_dataset(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps({"format_version": 1, "fingerprint": "x"}))


def test_overwrite_replaces_only_a_dataset(tmp_path, capsys):
    source_tree = tmp_path / "project"
    source_tree.mkdir()
    (source_tree / "train.py").write_text("precious = True\n")
    before = _tree(source_tree)
    _refused(capsys, source_tree, "holds no rrtrain dataset")
    assert _tree(source_tree) == before
    data = tmp_path / "data"
    assert prep(*PREP, "--out", str(data)) == 0
    assert prep(*PREP, "--out", str(data), "--overwrite", "--seed", "1") == 0  # a dataset: replaced
    assert json.loads((data / "manifest.json").read_text())["seed"] == 1


def test_overwrite_never_replaces_the_working_directory_its_parents_or_a_home(tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"
    _fake_dataset(work)  # even one that looks like a dataset
    (work / "train.py").write_text("precious = True\n")
    (work / "sub").mkdir()
    before = _tree(tmp_path)
    monkeypatch.chdir(work)
    _refused(capsys, ".", "is the working directory or a parent of it")
    monkeypatch.chdir(work / "sub")
    _refused(capsys, "..", "is the working directory or a parent of it")
    _refused(capsys, tmp_path, "is the working directory or a parent of it")
    home = tmp_path / "home"
    _fake_dataset(home)
    monkeypatch.setenv("HOME", str(home))
    _refused(capsys, home, "is a home directory")
    assert _tree(tmp_path) == {**before, **{f"home/{k}": v for k, v in _tree(home).items()}}


def test_new_dataset_is_the_users_alone_or_the_groups_to_read(tmp_path, monkeypatch):
    monkeypatch.delenv("RRTRAIN_GROUP_READ", raising=False)
    old = os.umask(0o022)
    try:
        assert prep(*PREP, "--out", str(tmp_path / "a")) == 0
        assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700  # not the umask's 0755
        monkeypatch.setenv("RRTRAIN_GROUP_READ", "1")
        assert prep(*PREP, "--out", str(tmp_path / "b")) == 0
        assert (tmp_path / "b").stat().st_mode & 0o777 == 0o750
    finally:
        os.umask(old)


def test_the_rule_for_a_recorded_ending():
    for ended in ("completed", "stalled", "diverged"):
        assert keeps_recorded(ended, "failed", training_started=True)  # never replaced by a later failure
        assert not keeps_recorded(ended, "completed", training_started=True)  # an extended run may complete
    assert keeps_recorded("preempted", "failed", training_started=False)  # failed before training: untouched
    assert not keeps_recorded("preempted", "failed", training_started=True)
    assert not keeps_recorded(None, "failed", training_started=False)  # nothing recorded: say it failed


@pytest.fixture(scope="module")
def finished(stories_data, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(run_dir, stories_data, "train.max_steps=2", "train.eval_every=0", "data.eval_batches=1")
    return run_dir


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run_dir, dst)
    return dst


@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_a_refused_resume_leaves_final_json_alone(finished, stories_data, tmp_path):
    run_dir = _copy(finished, tmp_path)
    before = (run_dir / "final.json").read_bytes()
    proc = train(run_dir, stories_data, "train.max_steps=2", "train.eval_every=0", "data.eval_batches=1",
                 "train.lr=0.1", expect=2)
    assert "refusing to resume with a changed configuration" in proc.stderr
    assert (run_dir / "final.json").read_bytes() == before
    assert json.loads(before)["status"] == "completed"
    assert not (run_dir / "run.lock").exists()  # the directory is free again


@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_a_garbage_metrics_line_neither_fails_a_finished_run_nor_blocks_resume(finished, stories_data, tmp_path):
    run_dir = _copy(finished, tmp_path)
    with open(run_dir / "metrics.jsonl", "ab") as f:
        f.write(b"\xff\xfe not UTF-8\n\"a string\"\n[[[[\n" + b"[" * 100_000 + b"\n")
    train(run_dir, stories_data, "train.max_steps=2", "train.eval_every=0", "data.eval_batches=1")
    assert json.loads((run_dir / "final.json").read_text())["status"] == "completed"
    train(run_dir, stories_data, "train.max_steps=3", "train.eval_every=0", "data.eval_batches=1",
          "train.allow_config_change=true")
    assert json.loads((run_dir / "final.json").read_text())["step"] == 3


@pytest.mark.parametrize("kind", ["fifo", "directory"])
@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_a_metrics_file_that_is_a_fifo_or_a_directory_is_one_line_and_left_alone(finished, stories_data, tmp_path,
                                                                                 kind):
    run_dir = _copy(finished, tmp_path)
    before = _tree(run_dir)
    metrics = run_dir / "metrics.jsonl"
    metrics.unlink()
    os.mkfifo(metrics) if kind == "fifo" else metrics.mkdir()
    # a FIFO must not hang the run: the subprocess's timeout would raise
    proc = train(run_dir, stories_data, "train.max_steps=2", "train.eval_every=0", "data.eval_batches=1",
                 expect=2, timeout=120)
    err = proc.stderr.strip()
    assert err == (f"rrtrain train: error: {metrics} is a {'FIFO' if kind == 'fifo' else 'directory'}, not a file: "
                   "move it out of the run directory and start the run again (it is left as it is)"), err
    assert (metrics.is_fifo() if kind == "fifo" else metrics.is_dir())
    assert {k: v for k, v in _tree(run_dir).items()} == {k: v for k, v in before.items() if k != "metrics.jsonl"}
    assert not (run_dir / "run.lock").exists()


BREAKS = """
from rrtrain.training.loop import Callback


class Breaks(Callback):
    name = "breaks"

    def on_step_end(self, loop):
        raise RuntimeError("a failure after training started")
"""


@pytest.mark.slow  # trains in a subprocess (make test-fast leaves it out)
def test_a_completed_run_stays_completed_when_a_later_attempt_fails_while_training(finished, stories_data,
                                                                                   tmp_path):
    run_dir = _copy(finished, tmp_path)
    before = (run_dir / "final.json").read_bytes()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "rrtrain_test_breaks.py").write_text(BREAKS)
    proc = run_from(tmp_path / "lib", train_cmd(run_dir, stories_data, [
        "train.max_steps=3", "train.eval_every=0", "data.eval_batches=1", "train.allow_config_change=true",
        "train.callbacks=[rrtrain_test_breaks:Breaks]"]), timeout=300)
    assert proc.returncode == 1 and "a failure after training started" in proc.stderr, proc.stderr[-2000:]
    assert (run_dir / "final.json").read_bytes() == before  # the completed ending stands
    assert not (run_dir / "run.lock").exists()

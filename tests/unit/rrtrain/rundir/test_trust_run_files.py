"""The trainer's own names in its run directory, hostile or broken: each one that holds something rrtrain
would never have put there (a FIFO, a directory where a file belongs, a symbolic link, a file that cannot be
read or is larger than rrtrain ever writes, a file where a directory belongs) is refused in one line naming it,
and left as it is; metrics.jsonl is never appended to through a link, nor read a whole overlong line at a
time. The end-to-end case (a real run refused, exit 2, final.json untouched) is in test_trust_nothing_lost.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rrtrain.core import files
from rrtrain.rundir import layout, metrics, own_files

MAKERS = {
    "fifo": lambda p: os.mkfifo(p),
    "directory": lambda p: p.mkdir(),
    "symlink outside": lambda p: p.symlink_to(p.parent.parent / "outside"),
    "dangling symlink": lambda p: p.symlink_to(p.parent / "nothing"),
    "symlink to a device": lambda p: p.symlink_to("/dev/zero"),
}


@pytest.fixture
def run_dir(tmp_path) -> Path:
    (tmp_path / "outside").write_text("someone else's\n")
    run = tmp_path / "run"
    run.mkdir()
    return run


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize("name", sorted(own_files.FILES))
def test_a_file_name_holding_anything_but_a_file_is_refused_in_one_line(run_dir, name, maker):
    MAKERS[maker](run_dir / name)
    line = own_files.problem(run_dir)
    assert line and line.startswith(f"{run_dir / name} is ") and "\n" not in line, line
    assert "move it out of the run directory" in line
    assert os.path.lexists(run_dir / name)  # left as it is
    assert (run_dir.parent / "outside").read_text() == "someone else's\n"


@pytest.mark.parametrize("name", sorted(own_files.DIRS))
def test_a_directory_name_holding_a_file_or_a_fifo_is_refused(run_dir, name):
    (run_dir / name).write_text("x")
    assert own_files.problem(run_dir) == (f"{run_dir / name} is a file, not a directory: move it out of the run "
                                          "directory and start the run again (it is left as it is)")
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    assert "is a FIFO, not a directory" in own_files.problem(run_dir)


def test_what_rrtrain_writes_is_accepted_and_a_linked_directory_is_followed(run_dir, tmp_path):
    for name in own_files.FILES:
        (run_dir / name).write_text("{}\n")
    (tmp_path / "scratch").mkdir()
    (run_dir / layout.CHECKPOINTS).symlink_to(tmp_path / "scratch")  # checkpoints on another filesystem
    (run_dir / layout.TENSORBOARD).mkdir()
    assert own_files.problem(run_dir) is None
    assert own_files.problem(tmp_path / "empty") is None  # a run not started yet


def test_an_oversized_or_unreadable_file_is_refused(run_dir, monkeypatch):
    with open(run_dir / layout.FINAL, "wb") as f:
        f.truncate(own_files.MAX_JSON_BYTES + 1)  # sparse: no disk spent
    assert f"is {own_files.MAX_JSON_BYTES + 1} bytes, more than rrtrain ever writes" in own_files.problem(run_dir)
    (run_dir / layout.FINAL).unlink()
    with open(run_dir / layout.METRICS, "wb") as f:
        f.truncate(own_files.MAX_JSON_BYTES + 1)  # metrics.jsonl has no whole-file limit (read line by line)
    assert own_files.problem(run_dir) is None

    real = files.open_regular

    def denied(path):  # noqa: ANN001 - tests run as root, whom chmod 000 does not stop
        if Path(path).name == layout.METRICS:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(own_files.files, "open_regular", denied)
    assert own_files.problem(run_dir) == (f"{run_dir / layout.METRICS} cannot be read (Permission denied): move "
                                          "it out of the run directory and start the run again (it is left as it is)")


@pytest.mark.parametrize("maker", ["fifo", "symlink outside", "dangling symlink"])
def test_metrics_are_never_appended_through_a_link_or_to_a_fifo(run_dir, maker):
    path = run_dir / layout.METRICS
    MAKERS[maker](path)
    with pytest.raises(OSError):
        metrics.open_for_append(path)  # at once: a FIFO does not wait for a reader
    assert (run_dir.parent / "outside").read_text() == "someone else's\n"
    assert not (run_dir / "nothing").exists()


def test_a_fresh_start_replaces_a_dangling_link_instead_of_writing_through_it(run_dir):
    (run_dir / layout.METRICS).symlink_to(run_dir.parent / "planted")
    log = metrics.MetricsLogger(run_dir, enabled=True)
    log.log({"step": 1, "loss": 1.0})
    log.close()
    assert not (run_dir.parent / "planted").exists()
    assert (run_dir / layout.METRICS).read_text().startswith('{"step": 1')


def test_an_overlong_metrics_line_is_skipped_without_being_held_whole(run_dir, monkeypatch):
    monkeypatch.setattr(metrics, "MAX_LINE_BYTES", 64)
    path = run_dir / layout.METRICS
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n' + b'{"step": 1, "pad": "' + b"x" * 500 + b'"}\n'
                     + b'{"step": 2, "loss": 1.5}\n' + b'{"step": 3, "loss": 1.0}\n' + b"y" * 300)
    seen: list[int] = []
    real = metrics._lines

    def watched(fh, limit):  # noqa: ANN001
        for line in real(fh, limit):
            seen.append(len(line))
            yield line

    monkeypatch.setattr(metrics, "_lines", watched)
    logger = metrics.MetricsLogger(run_dir, enabled=False)  # disabled: it writes nothing by itself
    logger._truncate(2)
    assert path.read_bytes() == b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'
    assert max(seen) <= 65


@pytest.mark.parametrize("entry,make,expect", [
    ("latest", lambda p: p.mkdir(), "is a directory, not a file"),
    ("latest", lambda p: os.mkfifo(p), "is a FIFO, not a file"),
    ("step_00000004", lambda p: p.write_text("x"), "is a file, not a directory"),
    (".tmp_step_00000004", lambda p: os.mkfifo(p), "is a FIFO, not a directory"),
    ("step_00000004", lambda p: p.symlink_to("step_00000002"),
     "is a symbolic link (to 'step_00000002'): rrtrain follows a link at checkpoints/ only"),
])
def test_a_checkpoint_name_holding_the_wrong_kind_is_refused(run_dir, entry, make, expect):
    (run_dir / layout.CHECKPOINTS).mkdir()
    (run_dir / layout.CHECKPOINTS / "step_00000002").mkdir()
    (run_dir / layout.CHECKPOINTS / "notes.txt").write_text("the user's own: left alone")
    assert own_files.problem(run_dir) is None
    make(run_dir / layout.CHECKPOINTS / entry)
    assert own_files.problem(run_dir).startswith(f"{run_dir / layout.CHECKPOINTS / entry} {expect}: ")


def test_the_artifact_directory_may_not_be_a_link(run_dir, tmp_path):
    """Of the model's state a link is followed at checkpoints/ alone (docs/reliability.md): export, eval and a
    warm start read artifact/ as the run's own."""
    (tmp_path / "scratch").mkdir()
    (run_dir / layout.ARTIFACT).symlink_to(tmp_path / "scratch")
    line = own_files.problem(run_dir)
    assert line.startswith(f"{run_dir / layout.ARTIFACT} is a symbolic link (to ") and "\n" not in line
    assert "rrtrain follows a link at checkpoints/ only" in line and os.path.islink(run_dir / layout.ARTIFACT)


def test_this_hosts_data_cache_must_be_a_directory(run_dir):
    import socket

    (run_dir / layout.DATA_CACHE).mkdir()
    (run_dir / layout.DATA_CACHE / socket.gethostname()).write_text("x")
    assert "is a file, not a directory" in own_files.problem(run_dir)


def test_a_callback_state_that_does_not_fit_is_one_line():
    """A checkpoint's train state is checked for shape (rrtrain.rundir.train_state), not each callback's
    contents: one that does not fit its callback is a UsageError naming it, not a traceback."""
    from rrtrain.config import MonitorConfig
    from rrtrain.core.errors import UsageError
    from rrtrain.monitoring.callback import MonitorCallback
    from rrtrain.training.callbacks import NonfiniteGuard
    from rrtrain.training.trainer import Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.callbacks = [NonfiniteGuard("skip", 5), MonitorCallback(MonitorConfig())]
    trainer.load_callback_states({"nonfinite": {"streak": 2}})  # one that fits
    trainer.load_callback_states({"monitor": trainer.callbacks[1].state_dict()})
    for states, name in (({"nonfinite": {"streak": [1]}}, "nonfinite"), ({"nonfinite": "x"}, "nonfinite"),
                         ({"monitor": {"ema": "1.0"}}, "monitor"), ({"monitor": {"raised": {"stalled": 3}}}, "monitor"),
                         ({"monitor": {"recent": [1.0, None]}}, "monitor"), ({"monitor": [1]}, "monitor")):
        with pytest.raises(UsageError, match=f"callbacks.{name} does not fit the callback") as refused:
            trainer.load_callback_states(states)
        assert "\n" not in str(refused.value)

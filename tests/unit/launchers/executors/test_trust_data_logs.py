"""The local executor appends each run's output to SWEEP/slurm/logs/RUN.log only as a regular file opened without
following a link, in a logs directory that is not a link: a planted link is left as it is and said in one line,
and the file it points to does not grow. Budget: about 2 s (the "runs" are `python -c`)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from launchers.executors import local as local_executor
from rrtrain.core.errors import UsageError


def run(rid: str) -> SimpleNamespace:
    return SimpleNamespace(id=rid, resources=SimpleNamespace(cpus_per_task=1))


@pytest.fixture
def fake_train(monkeypatch):
    """Each run prints one line and ends (the executor's own code around it is what is tested)."""
    monkeypatch.setattr(local_executor, "train_argv",
                        lambda r, python, config: [sys.executable, "-c", f"print('output of {r.id}')"])


def submit(sweep: Path, *ids: str):
    """The runs as a sweep hands them over: a code snapshot and a config each (what the executor binds)."""
    code = sweep.parent / "code"
    code.mkdir(exist_ok=True)
    configs = {i: sweep.parent / f"{i}.yaml" for i in ids}
    for path in configs.values():
        path.write_text("train: {max_steps: 1}\n")
    return local_executor.submit([run(i) for i in ids], sys.executable, str(code), configs, sweep / "slurm" / "logs",
                                 parallel=2)


def test_a_log_planted_as_a_link_is_not_followed(tmp_path, fake_train, capsys):
    sweep = tmp_path / "sweep"
    logs = sweep / "slurm" / "logs"
    logs.mkdir(parents=True)
    bashrc = tmp_path / ".bashrc"
    bashrc.write_text("mine\n")
    (logs / "a.log").symlink_to(bashrc)
    os.mkfifo(logs / "b.log")
    result: list = []
    worker = threading.Thread(target=lambda: result.append(submit(sweep, "a", "b", "c")), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the sweep blocked on a log (a FIFO opened for writing waits for a reader)"
    jobs, codes = result[0]
    assert codes == {"a": 0, "b": 0, "c": 0}
    assert bashrc.read_text() == "mine\n"  # the link's target did not grow by the run's log
    assert (logs / "a.log").is_symlink() and (logs / "b.log").is_fifo()
    out = capsys.readouterr().out
    assert f"{logs / 'a.log'} is a symbolic link: not followed" in out
    assert f"{logs / 'b.log'} is not" in out
    assert "output of c" in (logs / "c.log").read_text()


def test_a_logs_directory_that_is_a_link_is_refused(tmp_path, fake_train):
    sweep = tmp_path / "sweep"
    (sweep / "slurm").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (sweep / "slurm" / "logs").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="is a symbolic link"):
        submit(sweep, "a")
    (sweep / "slurm" / "logs").unlink()
    (sweep / "slurm").rmdir()
    (sweep / "slurm").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="is a symbolic link"):
        submit(sweep, "a")
    assert list(elsewhere.iterdir()) == []

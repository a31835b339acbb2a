"""An OSError about a path the user named (a run directory they cannot enter, a sweep directory they cannot write
into) ends the command in one line naming the path, exit 2, at the one boundary every command passes
(`rrtrain.core.command.run_command`, `path_refusal`), never a traceback. Root passes every permission check, so
each command runs in a forked child that has become another user (uid 12345): the PermissionError is the kernel's
own. The child imports nothing new (torch and the commands are imported here, before the fork): about 0.1 CPU-s
per case."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Callable, Iterator

import pytest

from launchers import cancel
from rrtrain.artifact import run as artifact_run
from rrtrain.cli import eval as eval_cli, export as export_cli, main as cli, sweep as sweep_cli
from rrtrain.core.command import path_refusal, run_command
from rrtrain.export import hf

#: imported here, before any fork: the child imports nothing (torch is seconds of CPU)
PRELOADED = (cancel, artifact_run, eval_cli, export_cli, sweep_cli, hf)

OTHER = 12345  # the uid (and gid) the child becomes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="becomes another user: needs root")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the child can enter (tmp_path's parents are root's 0700): root's, 0755, in /tmp."""
    base = Path(tempfile.mkdtemp(prefix="rrtrain-oserror-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


def as_other_user(call: Callable[[], int]) -> tuple[int, str]:
    """(exit status, stderr) of `call()` in a forked child running as uid/gid OTHER; an exception that escapes
    `call` is printed as its traceback and exits 70."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.dup2(write_fd, 2)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            os.setgroups([])
            os.setgid(OTHER)
            os.setuid(OTHER)
            code = call()
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 70)
    os.close(write_fd)
    with os.fdopen(read_fd, "r", errors="replace") as fh:
        err = fh.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


def closed_run(base: Path) -> Path:
    """A run directory the other user cannot enter (root's, 0700), holding what a run directory holds."""
    run = base / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {size: tiny}\n")
    (run / "metrics.jsonl").write_text("")
    run.chmod(0o700)
    return run


def one_line(code: int, err: str, path: Path) -> None:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and "Permission denied" in err, err


def test_eval_of_a_run_directory_the_user_cannot_enter(shared):
    run = closed_run(shared)
    code, err = as_other_user(lambda: cli.main(["eval", str(run), "--tasks", "hellaswag"]))
    one_line(code, err, run)


def test_export_of_a_run_directory_the_user_cannot_enter(shared):
    run = closed_run(shared)
    code, err = as_other_user(lambda: cli.main(["export", str(run), "--hf", str(shared / "out")]))
    one_line(code, err, run)


def test_cancel_flagged_that_cannot_write_the_marker(shared):
    """A sweep directory of the user's own (private), a flagged run in it they cannot write into (root's, 0755):
    writing its cancelled.json fails with the kernel's PermissionError, said in one line naming the file, and its
    job is not stopped (the marker comes first: `launchers.cancel`)."""
    sweep = shared / "sweep"
    run = sweep / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("model: {size: tiny, variant: standard}\ntrain: {seed: 0}\n")
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "flag", "flag": "diverged", "step": 5}) + "\n")
    record = {"version": 1, "name": "s", "runs": {"r": {"size": "tiny", "variant": "standard", "seed": 0,
                                                        "dir": str(run), "config": {}}},
              "submissions": [{"executor": "local", "jobs": {"r": "local:1"}}]}
    (sweep / "sweep.json").write_text(json.dumps(record))
    os.chown(sweep, OTHER, OTHER)
    os.chown(sweep / "sweep.json", OTHER, OTHER)
    sweep.chmod(0o700)
    code, err = as_other_user(lambda: cli.main(["sweep", "--cancel-flagged", str(sweep)]))
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "Permission denied" in err and str(run / "cancelled.json") in err, err
    assert not (run / "cancelled.json").exists()


def test_only_errors_of_a_path_become_one_line(capsys):
    """A disk error stays a traceback (it is no bad input); a refusal without a path names nothing to fix."""
    def raising(err: OSError) -> Callable[[list[str]], int]:
        def entry(argv: list[str]) -> int:
            raise err
        return entry

    denied = PermissionError(errno.EACCES, "Permission denied", "/some/run/config.yaml")
    assert run_command("rrtrain eval", raising(denied), []) == 2
    assert capsys.readouterr().err.strip() == f"rrtrain eval: error: {path_refusal(denied)}"
    assert path_refusal(IsADirectoryError(errno.EISDIR, "Is a directory", "/x")) is not None
    with pytest.raises(OSError):
        run_command("rrtrain eval", raising(OSError(errno.ENOSPC, "No space left on device", "/x")), [])
    with pytest.raises(OSError):
        run_command("rrtrain eval", raising(OSError(errno.EACCES, "Permission denied")), [])

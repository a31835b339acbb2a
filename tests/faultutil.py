"""Helpers of the fault-injection tests: waiting on ranks started srun-style (trainutil.start_ranks: no torchrun
above them to tear the group down when one dies), small real filesystems (tmpfs mounts: full disks,
read-only directories), and a call that must not block on a planted FIFO."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from trainutil import Process


def finish(procs: list[Process], timeout: float) -> list[tuple[int, str, str]]:
    """Wait for every rank (killing the rest when time runs out); (exit status, stdout, stderr) per rank."""
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            so, se = p.communicate()
            raise AssertionError(f"rank did not exit within {timeout} s:\n{so[-2000:]}\n{se[-3000:]}")
        out.append((p.returncode, so, se))
    return out


def can_mount() -> bool:
    """Whether this machine lets the tests mount a tmpfs (root with CAP_SYS_ADMIN)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d], capture_output=True).returncode:
            return False
        subprocess.run(["umount", d], check=True)
    return True


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (created), unmounted at the end whatever happens. Mode 0700, as the
    user's own scratch space is (a tmpfs root is 1777 by default, which rrtrain refuses to write into)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", "mode=0700", *options]), "tmpfs",
                    str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True, capture_output=True)


def resize(path: Path, size: str) -> None:
    """Grow (or shrink) a mounted tmpfs: space freed, as an operator would free it."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, capture_output=True)


def unblocked(call: Callable[[], Any], fifos: list[Path], timeout: float) -> Any:
    """`call()` in this process, waited on for at most `timeout` s: a call still blocked then (opening one of
    `fifos`, as the code before its fix was, for ever) is released by opening each FIFO's other end, and the
    test fails rather than hang. The call's result is returned and its exception raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked open returns and reads EOF
            except OSError:
                pass
        thread.join(timeout)
        pytest.fail(f"still blocked after {timeout} s (on {', '.join(map(str, fifos)) or 'no FIFO'})")
    if "error" in box:
        raise box["error"]
    return box.get("value")

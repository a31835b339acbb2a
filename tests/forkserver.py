"""A fork server for the tests' one-process training runs: one Python per pytest process imports torch and the
training stack once, then forks a child per `python -m rrtrain.train ...` the tests start, instead of a fresh
interpreter paying the imports (2-4 s of CPU) each time.

The child is the run as the subprocess was: its own session (a signal to its group reaches it and what it
starts, and nothing else), stdin from /dev/null, stdout and stderr the pipes the test reads, the test's
environment and working folder, `sys.argv` and `sys.path[0]` as `python -m` sets them, `__main__` run by runpy,
and at its end the interpreter's own exit (non-daemon threads joined, atexit hooks, flushed streams, the exit
status; a signal's death is a negative `returncode` as with Popen). What the imports printed to stderr in the
server is printed again at the start of each child's stderr. Its exit status comes from the server, which reaps
it, over the request's socket.

What it cannot be: a process whose interpreter started with other settings. A server serves only requests whose
environment matches its own in what Python, torch or OpenMP read when they start (PYTHON*, OMP_*, TORCH*, ...);
trainutil keeps a server per such environment, or starts a plain subprocess (`trainutil.spawn` decides), as it
does for everything under `make test-fast` (its guard watches Popen) and every run when
RRTRAIN_TEST_FORKSERVER=0.

Run as a script, this file is the server: `python forkserver.py SOCKET [MODULE ...]` (the modules to import
first); it ends when its stdin closes.
"""

from __future__ import annotations

import gc
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Optional

from launchers.executors import warm

ENV_SWITCH = "RRTRAIN_TEST_FORKSERVER"  # "0": every run is a plain subprocess
# Read by the interpreter, torch or its thread pools when they start: a request that differs here is no fork.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "PYTORCH", "CUDA", "LD_", "MALLOC", "GOMP_")
# What a run imports anyway: the local executor's warm server's list (launchers.executors.warm), without the
# training module itself, which each child runs as `__main__` (the server also forks `python -m rrtrain ...`).
PRELOAD = tuple(m for m in warm.PRELOAD if m != warm.MODULE)
MAX_REQUEST = 1 << 20
CHILD_CPU = [0.0]  # CPU seconds of the children this process's runs ended (a profile reads it; the server reaps them)


def startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


# -- the test's side ---------------------------------------------------------------------------------------


class Client:
    """A server started with `env` (the start-up environment it serves) that preloads `preload`; `stop` ends it."""

    def __init__(self, python: str, env: dict[str, str], cwd: str, preload: Sequence[str] = PRELOAD) -> None:
        self.folder = tempfile.mkdtemp(prefix="rrtrain-forkserver-")
        self.path = os.path.join(self.folder, "socket")
        self.env = dict(env)
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), self.path, *preload], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while not os.path.exists(self.path + ".ready"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the tests' fork server did not start (exit {self.proc.poll()})")
            time.sleep(0.02)

    def serves(self, env: dict[str, str]) -> bool:
        return self.proc.poll() is None and startup_env(env) == startup_env(self.env)

    def start(self, argv: list[str], env: dict[str, str], cwd: str, merge_stderr: bool) -> "Forked":
        out_r, out_w = os.pipe()
        err_r, err_w = (None, out_w) if merge_stderr else os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self.path)
            request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
            socket.send_fds(conn, [request], [out_w, err_w])
            pid = json.loads(conn.recv(4096))["pid"]
        except BaseException:
            conn.close()
            for fd in (out_r, err_r):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            os.close(out_w)
            if err_w != out_w:
                os.close(err_w)
        return Forked(argv, pid, conn, out_r, err_r)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the server kills what is left of its children and ends
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        os.rmdir(self.folder)


def _readable(fds: list[int], timeout: Optional[float]) -> set[int]:
    """Which of `fds` can be read (or hung up) within `timeout` seconds. poll, not select: a long pytest
    process holds descriptors above select's limit of 1024."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    ms = None if timeout is None else max(0, int(timeout * 1000))
    return {fd for fd, _ in poller.poll(ms)}


class Forked:
    """The part of subprocess.Popen the tests use, for a child of the server (text mode)."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket, out_fd: int, err_fd: Optional[int]) -> None:
        self.args, self.pid, self._conn = args, pid, conn
        self.stdin = None
        self.stdout = io.open(out_fd, "r", errors="strict")  # noqa: SIM115 - the caller reads it, as from Popen
        self.stderr = io.open(err_fd, "r") if err_fd is not None else None  # noqa: SIM115
        self.returncode: Optional[int] = None
        self._read: dict[str, list[str]] = {}
        self._readers: list[threading.Thread] = []

    def _status(self, timeout: Optional[float]) -> Optional[int]:
        if self.returncode is None:
            if _readable([self._conn.fileno()], timeout):
                data = self._conn.recv(4096)
                self._conn.close()
                if not data:
                    raise RuntimeError(f"the tests' fork server ended before child {self.pid} did")
                reply = json.loads(data)
                CHILD_CPU[0] += reply.get("cpu", 0.0)
                self.returncode = reply["exit"]
        return self.returncode

    def poll(self) -> Optional[int]:
        return self._status(0)

    def wait(self, timeout: Optional[float] = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def communicate(self, input: Any = None, timeout: Optional[float] = None) -> tuple[Optional[str], Optional[str]]:
        """Both streams to their end and the exit status; TimeoutExpired leaves the readers reading, as Popen does."""
        if not self._readers:
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)):
                if stream is not None:
                    chunks = self._read.setdefault(name, [])
                    t = threading.Thread(target=lambda s=stream, c=chunks: c.append(s.read()), daemon=True)
                    t.start()
                    self._readers.append(t)
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        out = "".join(self._read["stdout"])
        return out, ("".join(self._read["stderr"]) if self.stderr is not None else None)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *exc: Any) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()

    def __del__(self) -> None:
        try:
            self._conn.close()
        except Exception:
            pass


# -- the server's side ------------------------------------------------------------------------------------


def _child(request: dict, fds: list[int], inherited: list[int], preamble: bytes, ready: int) -> None:
    """In the forked child: become the run the request names, then exit as the interpreter would
    (launchers.executors.warm.run_as_main, the product's own warm starts). Never returns. Closing `ready` tells
    the server that the session and the streams are in place (its client may signal it)."""
    try:
        os.setsid()
        for fd in inherited:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)  # above 2: the server's 0, 1 and 2 are open
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in {null, *fds}:
            os.close(fd)
        os.close(ready)
        os.chdir(request["cwd"])
        os.environ.clear()  # in place: modules hold os.environ itself
        os.environ.update(request["env"])
        argv = request["argv"]
        sys.path[0] = os.getcwd()  # what `python -m` puts first
        if preamble:
            os.write(2, preamble)
    except BaseException:
        os._exit(127)
    warm.run_as_main(argv[argv.index("-m") + 1], argv[argv.index("-m") + 2:])  # never returns


def serve(path: str, preload: Sequence[str]) -> None:
    """Import `preload`, then accept requests on `path` until stdin closes; fork a child per request; report each
    exit."""
    preamble = warm.preload_modules(preload)  # what the imports printed, to print again in each child
    # The imported modules live as long as any child: out of the collector's reach, a child's full collections
    # do not walk them (and write to every page they touch, copying the server's heap page by page).
    gc.collect()
    gc.freeze()

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    Path(path + ".ready").touch()
    children: dict[int, socket.socket] = {}
    stdin = sys.stdin.fileno()
    while True:
        ready = _readable([listener.fileno(), stdin], 0.02 if children else 1.0)
        if stdin in ready and not os.read(stdin, 4096):
            break
        if listener.fileno() in ready:
            conn, _ = listener.accept()
            try:
                data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 2)
                request = json.loads(data)
                sys.stdout.flush()
                sys.stderr.flush()
                inherited = [listener.fileno(), conn.fileno(), *(c.fileno() for c in children.values())]
                wait_r, wait_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, [*inherited, wait_r], preamble, wait_w)
                os.close(wait_w)
                os.read(wait_r, 1)  # EOF: the child closed its end (or died)
                os.close(wait_r)
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                children[pid] = conn
            except Exception as err:  # a broken request: the client sees its socket close
                print(f"forkserver: {type(err).__name__}: {err}", file=sys.stderr)
                conn.close()
        while children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status),
                                          "cpu": usage.ru_utime + usage.ru_stime}).encode())
                except OSError:
                    pass  # the test no longer listens
                conn.close()
    for pid in children:  # left running by a test that ended: gone with the session
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])

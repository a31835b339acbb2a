"""Warm starts for the local executor's one-process runs: one interpreter per sweep imports torch and the training
stack once, then forks a child per run, instead of a fresh `python -m rrtrain.train` paying those imports
(~6 CPU seconds a run here, docs/performance.md) each time: at the sizes a CPU sweep trains, as long as the
training itself.

The child is the run as the plain subprocess was: the same interpreter, started from the same folder with the
same environment (the server starts as the run would, so its sys.path is the run's, the sweep's verified
snapshot first), stdin from /dev/null, stdout and stderr the run's log, `sys.argv` as `python -m` sets it,
`__main__` run by runpy, and at its end the interpreter's own exit (non-daemon threads joined, atexit hooks,
flushed streams, the exit status; a signal's death a negative status, as with Popen). It stays in the sweep's
process group, so Ctrl-C reaches it as it reached the subprocess. What differs: its command line is the
server's (`python -P .../launchers/executors/warm.py rrtrain.train ...`), and only `RRTRAIN_CONFIG_SHA256` may
differ between the runs one server starts (a run whose environment differs in anything else gets a server of its
own).

The server talks to the executor over a socket pair it inherits: nothing on the filesystem, nothing another
process can reach. It signals only children it has not reaped yet (a pid it reaped is never signalled again), and
when the executor goes away it stops taking runs and ends once its children have. RRTRAIN_WARM_START=0 starts
every run as a plain subprocess.
"""

from __future__ import annotations

import gc
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
from collections.abc import Sequence
from typing import Any, Optional

SWITCH_ENV = "RRTRAIN_WARM_START"  # "0": plain subprocesses
MODULE = "rrtrain.train"  # what the server's children run
#: what a training run imports whatever its config: imported once by the server. streaming's submodules through
#: rrtrain's lazy import (rrtrain.core.lazy_import), which leaves out its package __init__ (transformers, pyarrow);
#: TensorBoard's record writer and protocol buffers, which every run's event file uses (the writer's package
#: imports boto3 where it is installed: ~0.3 CPU-s a run, paid here once)
PRELOAD = ("torch", "torch.distributed.checkpoint", "torch._dynamo", "numpy", "yaml",
           "streaming.base.dataset", "streaming.base.shuffle", "streaming.base.constant", "streaming.base.util",
           "tensorboard.compat.proto.event_pb2", "tensorboard.compat.proto.summary_pb2",
           "tensorboard.compat.proto.tensor_pb2", "tensorboard.summary.writer.record_writer",
           "rrtrain.resolve", "rrtrain.core.command", "rrtrain.training.trainer", "rrtrain.training.callbacks",
           "rrtrain.training.console", "rrtrain.training.pause", "rrtrain.monitoring.callback",
           "rrtrain.monitoring.watchdog", "rrtrain.rundir.outcome", "rrtrain.rundir.ranks",
           "rrtrain.training.checkpoint", "rrtrain.data.loader", "rrtrain.data.shm", "rrtrain.train")
START_TIMEOUT_S = 600.0
MAX_MESSAGE = 1 << 20


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1") != "0" and hasattr(os, "fork") and hasattr(socket, "send_fds")


def server_key(env: dict[str, str]) -> frozenset:
    """Runs whose environments have the same key can be children of one server: all but the config's digest."""
    from rrtrain.config_load import CONFIG_DIGEST_ENV

    return frozenset((k, v) for k, v in env.items() if k != CONFIG_DIGEST_ENV)


# -- the executor's side ------------------------------------------------------------------------------------


def server_argv(python: str, module: str, fd: int, preload: Sequence[str]) -> list[str]:
    """The server's command line: this very file of the running rrtrain, run as a script, with nothing of its own
    folder on sys.path (`-P`; Python 3.10, which lacks it, drops the entry itself), so that the sweep's snapshot,
    first on PYTHONPATH, is where the runs' code comes from, whichever rrtrain made the snapshot
    (`rrtrain.core.child_python.script_argv`). The server part of this file needs the standard library alone."""
    from rrtrain.core.child_python import script_argv

    return script_argv(os.path.abspath(__file__), module, str(fd), *preload, python=python)


class WarmServer:
    """A server of `module`'s runs, started with `python` in `cwd` with `env` (a run's environment), that imports
    `preload` first. `start` forks a run; `poll` takes the exit statuses the server reported; `close` lets it end
    once its children have."""

    def __init__(self, python: str, env: dict[str, str], cwd: str, module: str = MODULE,
                 preload: Sequence[str] = PRELOAD) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock, self.module = ours, module
        try:
            self.proc = subprocess.Popen(server_argv(python, module, theirs.fileno(), preload), env=env, cwd=cwd,
                                         stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self.exits: dict[int, int] = {}
        self.gone = False  # the server ended: what it had not reported is lost

    def start(self, args: list[str], env: dict[str, str], cwd: str, log_fd: int) -> int:
        """Fork a run of the module with `args`, its output into `log_fd`; its pid. RuntimeError when the server
        ended (it could not import what it preloads: the caller starts the run as a plain subprocess)."""
        request = json.dumps({"args": args, "env": env, "cwd": cwd}).encode()
        try:
            socket.send_fds(self.sock, [request], [log_fd])
        except OSError as err:
            self.gone = True
            raise RuntimeError(f"the warm interpreter is gone ({err})") from None
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            reply = self._receive(max(0.0, deadline - time.monotonic()))
            if reply is None:
                self.gone = True
                raise RuntimeError(f"the warm interpreter ended (exit {self.proc.poll()}) before starting the run")
            if "started" in reply:
                return int(reply["started"])

    def poll(self) -> None:
        """Take every exit status the server has reported so far into `exits`."""
        while not self.gone and self._receive(0.0) is not None:
            pass

    def signal(self, pid: int, sig: int) -> None:
        """`sig` to child `pid`, if it has not ended (the server signals only a child it has not reaped)."""
        try:
            self.sock.send(json.dumps({"signal": int(sig), "pid": pid}).encode())
        except OSError:
            self.gone = True

    def close(self) -> None:
        """No more runs: the server ends once its children have (waited for a little, as they normally have)."""
        self.sock.close()
        self.gone = True
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass  # a child still running (its run stopped but not yet ended): the server ends after it

    def _receive(self, timeout: float) -> Optional[dict[str, Any]]:
        """One message within `timeout` seconds (exit statuses go into `exits`); None when none came or the
        server ended."""
        if self.gone or not _readable(self.sock.fileno(), timeout):
            return None
        try:
            data = self.sock.recv(MAX_MESSAGE)
        except OSError:  # the server ended with a request of ours unread
            data = b""
        if not data:
            self.gone = True
            return None
        message = json.loads(data)
        if "exit" in message:
            self.exits[int(message["pid"])] = int(message["exit"])
        return message


class WarmRun:
    """The part of subprocess.Popen the local executor uses, for a child of a `WarmServer`."""

    def __init__(self, server: WarmServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.server.poll()
            if self.pid in self.server.exits:
                self.returncode = self.server.exits.pop(self.pid)
            elif self.server.gone:
                self.returncode = 1  # its end cannot be known (the server was killed): not counted as completed
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.server.module, timeout or 0.0)
            _readable(self.server.sock.fileno(), 0.2)
        return self.returncode  # type: ignore[return-value]

    def terminate(self) -> None:
        if self.poll() is None:
            self.server.signal(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.poll() is None:
            self.server.signal(self.pid, signal.SIGKILL)


def _readable(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(max(0, int(timeout * 1000))))


# -- the child's side -----------------------------------------------------------------------------------------


def exit_status(code: Any) -> int:
    """What the interpreter makes of SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_as_main(module: str, args: list[str]) -> None:
    """Run `module` as `python -m module args` would in this (forked) process, then end it as the interpreter
    ends: non-daemon threads joined, atexit hooks run, streams flushed, the exit status (an uncaught
    KeyboardInterrupt: death by SIGINT). Never returns."""
    code = 1
    try:
        sys.argv = [module, *args]  # runpy puts the module's file in argv[0]
        import runpy

        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = exit_status(stop.code)
        except KeyboardInterrupt:
            import traceback

            traceback.print_exc()
            code = -signal.SIGINT
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        try:
            threading._shutdown()  # type: ignore[attr-defined]  # the interpreter joins non-daemon threads first
        except Exception:
            pass
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code == -signal.SIGINT:  # as the interpreter ends on an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(code)


#: what the server ignores (Ctrl-C, a stop sent to the whole process group, a closed terminal: its children
#: take them and stop, then it reports how they ended), and each child handles as a fresh interpreter does
SHIELDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _child(module: str, request: dict[str, Any], log_fd: int, close: list[int], preamble: bytes,
           handlers: dict[int, Any]) -> None:
    """In the forked child: become the run the request names. Never returns."""
    try:
        for fd in close:
            os.close(fd)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in {null, log_fd} - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()  # in place: modules hold os.environ itself
        os.environ.update(request["env"])
        if preamble:
            os.write(2, preamble)
    except BaseException:
        os._exit(127)
    run_as_main(module, list(request["args"]))


# -- the server -------------------------------------------------------------------------------------------------


def preload_modules(names: Sequence[str]) -> bytes:
    """Import `names`; what the imports printed to stderr (printed again at the start of each run's log)."""
    try:  # the snapshot's own way to import streaming's submodules without its package __init__
        from rrtrain.core.lazy_import import streaming_module
    except ImportError:
        streaming_module = __import__

    captured = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(captured.fileno(), 2)
    collecting = gc.isenabled()
    gc.disable()  # the imports make long-lived objects, not garbage: the cyclic collector would only re-walk them
    try:
        for name in names:
            try:
                streaming_module(name) if name.startswith("streaming.") else __import__(name)
            except Exception:
                pass  # the run imports it itself, and fails there (in its own log, in one line) if it must
    finally:
        if collecting:
            gc.enable()
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    captured.seek(0)
    text = captured.read()
    captured.close()
    return text


def claim_private_names() -> None:
    """What a run does before its first step, done before the server's imports: torch's compile cache pointed at
    the user's private directory (`rrtrain.parallel.compile_policy.claim_compile_cache`), since importing
    torch._dynamo makes torch's default, host-wide, directory otherwise (a file a co-tenant put at that name made
    the import fail). A snapshot from an rrtrain without the claim is served without it."""
    try:
        from rrtrain.parallel.compile_policy import claim_compile_cache
    except ImportError:
        return
    claim_compile_cache()


def serve(module: str, fd: int, preload: Sequence[str]) -> None:
    """Import `preload`, then fork a child per request on the socket `fd` (a run of `module`) and report each one's
    exit status, until the executor closes its end; then wait for the children still running."""
    handlers = {sig: signal.getsignal(sig) for sig in SHIELDED}
    for sig in SHIELDED:
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    if "torch" in preload:
        claim_private_names()
    preamble = preload_modules(preload)
    # What the server imported lives as long as any child: out of the collector's reach, a child's collections
    # do not walk it (and write to every page they touch, copying the server's heap page by page).
    gc.collect()
    gc.freeze()
    children: set[int] = set()
    open_ = True
    while open_ or children:
        if open_ and _readable(fd, 0.05 if children else 1.0):
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                open_ = False
            else:
                _handle(module, sock, json.loads(data), fds, children, preamble, handlers)
        elif not open_:
            time.sleep(0.05)
        _reap(sock, children, open_)
    sock.close()


def _handle(module: str, sock: socket.socket, request: dict[str, Any], fds: list[int], children: set[int],
            preamble: bytes, handlers: dict[int, Any]) -> None:
    if "signal" in request:
        pid = int(request["pid"])
        if pid in children:  # not reaped yet: the pid is still this child's
            os.kill(pid, int(request["signal"]))
        return
    if len(fds) != 1:
        for f in fds:
            os.close(f)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(module, request, fds[0], [sock.fileno()], preamble, handlers)
    for f in fds:
        os.close(f)
    children.add(pid)
    sock.send(json.dumps({"started": pid}).encode())


def _reap(sock: socket.socket, children: set[int], report: bool) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        if report:
            try:
                sock.send(json.dumps({"pid": pid, "exit": os.waitstatus_to_exitcode(status)}).encode())
            except OSError:
                pass  # the executor is gone


if __name__ == "__main__":  # python -P .../launchers/executors/warm.py MODULE FD [PRELOAD ...]
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3:])

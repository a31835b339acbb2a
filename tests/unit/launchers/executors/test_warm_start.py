"""The local executor's warm starts (launchers.executors.warm): a run forked by the warm interpreter ends as the same
module run as a plain subprocess does (exit status, output into its log, environment, folder, stdin, atexit hooks
and threads, a traceback), a signal asked for reaches a run that has not ended and nothing else, Ctrl-C reaches
the runs and not the server, a server that dies fails its runs and the executor goes on with plain subprocesses,
and a server outlives its executor only until its children have ended. The server here serves a small module and
preloads nothing, so the file stays cheap (the training runs it serves in a sweep: tests/e2e/test_warm_start.py).
Budget: about 3 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchers.executors import local as local_executor
from launchers.executors import warm
from rrtrain.config_load import CONFIG_DIGEST_ENV
from rrtrain.core.child_python import child_env, module_argv

PROBE = '''
import atexit, os, signal, sys, threading, time
mode = sys.argv[1]
print("argv", sys.argv[1:], "cwd", os.getcwd(), "digest", os.environ.get("RRTRAIN_CONFIG_SHA256"), flush=True)
print("stdin", repr(sys.stdin.read()), "main", __name__, flush=True)
if mode == "exit":
    print("to stderr", file=sys.stderr, flush=True)
    sys.exit(int(sys.argv[2]))
if mode == "hooks":
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished", flush=True))).start()
if mode == "raise":
    raise ValueError("boom")
if mode == "term":
    signal.signal(signal.SIGTERM, lambda *_: (print("stopping at a step boundary", flush=True), sys.exit(75)))
if mode in ("term", "wait"):
    print("waiting", flush=True)
    for _ in range(6000):
        time.sleep(0.1)
if mode == "brief":
    time.sleep(0.5)
    print("finished its work", flush=True)
'''
DEADLINE_S = 60.0


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The runs' code, first on their PYTHONPATH as a sweep's snapshot is: the probe, and a `launchers` package of
    an older rrtrain without the warm server (a snapshot made before it): the server is the running rrtrain's."""
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "launchers" / "executors").mkdir(parents=True)
    (tmp_path / "launchers" / "__init__.py").write_text("")
    (tmp_path / "launchers" / "executors" / "__init__.py").write_text("")
    return tmp_path


def env_for(folder: Path, digest: str = "a" * 64) -> dict[str, str]:
    return {**child_env(), "PYTHONPATH": str(folder), CONFIG_DIGEST_ENV: digest}


@pytest.fixture
def server(folder: Path):
    # Started with SIGINT at its default: a shell starts a background job (`make test &`) with SIGINT ignored,
    # which the server and its runs would inherit (as a plain run would), and Ctrl-C would then stop nothing.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        s = warm.WarmServer(sys.executable, env_for(folder), str(folder), module="probe", preload=("json",))
    finally:
        signal.signal(signal.SIGINT, saved)
    yield s
    s.close()
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def start(server: warm.WarmServer, folder: Path, name: str, *args: str,
          digest: str = "b" * 64) -> tuple[warm.WarmRun, Path]:
    log = folder / f"{name}.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        pid = server.start(list(args), env_for(folder, digest), str(folder), fd)
    finally:
        os.close(fd)
    return warm.WarmRun(server, pid), log


def plain(folder: Path, name: str, *args: str, digest: str = "b" * 64) -> tuple[int, Path]:
    log = folder / f"{name}.log"
    with open(log, "ab") as out:
        code = subprocess.run(module_argv("probe", *args), stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, env=env_for(folder, digest), cwd=folder, timeout=60).returncode
    return code, log


def wait_for(log: Path, text: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while text not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)


@pytest.mark.parametrize("args", [("exit", "0"), ("exit", "3"), ("hooks",)])
def test_a_forked_run_ends_as_the_module_run_as_a_subprocess(server, folder, args):
    run, log = start(server, folder, "forked", *args)
    code, plain_log = plain(folder, "plain", *args)
    assert run.wait(timeout=DEADLINE_S) == code
    assert log.read_text() == plain_log.read_text()
    assert f"digest {'b' * 64}" in log.read_text() and "stdin '' main __main__" in log.read_text()


def test_an_uncaught_exception_is_its_traceback_and_status_1(server, folder):
    run, log = start(server, folder, "raise", "raise")
    assert run.wait(timeout=DEADLINE_S) == 1
    assert log.read_text().rstrip().endswith("ValueError: boom")


def test_terminate_and_kill_reach_the_run_and_its_status_comes_back(server, folder):
    stopping, stopping_log = start(server, folder, "term", "term")
    killed, killed_log = start(server, folder, "wait", "wait")
    wait_for(stopping_log, "waiting")
    wait_for(killed_log, "waiting")
    stopping.terminate()
    killed.kill()
    assert stopping.wait(timeout=DEADLINE_S) == 75 and "stopping at a step boundary" in stopping_log.read_text()
    assert killed.wait(timeout=DEADLINE_S) == -signal.SIGKILL


def test_ctrl_c_stops_the_runs_and_not_the_server(server, folder):
    run, log = start(server, folder, "wait", "wait")
    wait_for(log, "waiting")
    for pid in (server.proc.pid, run.pid):  # what a terminal's Ctrl-C sends to the sweep's process group
        os.kill(pid, signal.SIGINT)
    assert run.wait(timeout=DEADLINE_S) == -signal.SIGINT and "KeyboardInterrupt" in log.read_text()
    again, again_log = start(server, folder, "again", "exit", "0")
    assert again.wait(timeout=DEADLINE_S) == 0 and server.proc.poll() is None


def test_a_run_that_ended_is_never_signalled_again(server, folder):
    run, _ = start(server, folder, "ended", "exit", "0")
    assert run.wait(timeout=DEADLINE_S) == 0
    run.kill()  # ended: nothing is sent
    server.signal(run.pid, signal.SIGKILL)  # asked directly: the server reaped it, so the pid is not its own
    other, log = start(server, folder, "other", "exit", "4")
    assert other.wait(timeout=DEADLINE_S) == 4 and server.proc.poll() is None


def test_a_server_that_dies_fails_its_runs_and_the_executor_starts_plain_subprocesses(server, folder, monkeypatch):
    run, log = start(server, folder, "orphan", "wait")
    wait_for(log, "waiting")
    server.proc.kill()
    server.proc.wait()
    assert run.wait(timeout=DEADLINE_S) == 1  # its end cannot be known: not counted as completed
    os.kill(run.pid, signal.SIGKILL)  # the orphan, now init's

    monkeypatch.setattr(warm, "MODULE", "probe")
    servers = {warm.server_key(env_for(folder)): server}
    with open(folder / "next.log", "ab") as out:
        proc = local_executor.start_run(module_argv("probe", "exit", "5"), env_for(folder), str(folder), out,
                                        sys.executable, servers)
    assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=DEADLINE_S) == 5
    assert servers[warm.server_key(env_for(folder))] is None  # not asked again


def test_a_server_that_cannot_start_is_a_runtime_error_for_the_executor(folder):
    dead = warm.WarmServer("/bin/false", env_for(folder), str(folder), module="probe", preload=())
    fd = os.open(folder / "never.log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(RuntimeError, match="warm interpreter"):
            dead.start(["exit", "0"], env_for(folder), str(folder), fd)
    finally:
        os.close(fd)
        dead.close()


def test_the_server_ends_once_its_runs_have_when_the_executor_goes(server, folder):
    run, log = start(server, folder, "brief", "brief")
    server.close()  # the executor is gone: the run goes on to its end, then the server ends
    assert server.proc.wait(timeout=DEADLINE_S) == 0
    assert "finished its work" in log.read_text()


def test_a_server_of_training_runs_claims_the_private_compile_cache_before_its_imports(folder, monkeypatch):
    """torch._dynamo's import makes torch's compile-cache directory: a server that preloads torch points it at the
    user's private one first, as each run does before its first step (a co-tenant's file at torch's default name,
    /tmp/torchinductor_USER, failed the import). The probe, imported after torch, sees the variable set."""
    from rrtrain.parallel.compile_policy import CACHE_ENV

    (folder / "cacheprobe.py").write_text("import os, sys\nprint('cache dir:', os.environ.get(%r), file=sys.stderr)\n"
                                          % CACHE_ENV)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    env = {k: v for k, v in env_for(folder).items() if k != CACHE_ENV}
    s = warm.WarmServer(sys.executable, env, str(folder), module="probe", preload=("torch", "cacheprobe"))
    try:
        run, log = start(s, folder, "claimed", "exit", "0")
        assert run.wait(timeout=DEADLINE_S) == 0
    finally:
        s.close()
    line = next(x for x in log.read_text().splitlines() if x.startswith("cache dir:"))  # the server's import output
    claimed = line.split(": ", 1)[1]
    assert claimed != "None" and not claimed.startswith("/tmp/torchinductor_"), line


def test_the_executor_forks_one_process_runs_only(folder, monkeypatch):
    """A one-process run of the served module goes to a server for its environment (one per environment apart from
    the config digest); anything else, and everything under RRTRAIN_WARM_START=0, is a plain subprocess."""
    monkeypatch.setattr(warm, "MODULE", "probe")
    started: list[dict] = []

    class Recording(warm.WarmServer):
        def __init__(self, python: str, env: dict[str, str], cwd: str) -> None:
            started.append(env)
            super().__init__(python, env, cwd, module="probe", preload=())

    monkeypatch.setattr(warm, "WarmServer", Recording)
    servers: dict = {}
    procs = []
    with open(folder / "out.log", "ab") as out:
        for digest in ("c" * 64, "d" * 64):
            procs.append(local_executor.start_run(module_argv("probe", "exit", "0"), env_for(folder, digest),
                                                  str(folder), out, sys.executable, servers))
        procs.append(local_executor.start_run(module_argv("other.module"), env_for(folder), str(folder), out,
                                              sys.executable, servers))
        monkeypatch.setenv(warm.SWITCH_ENV, "0")
        procs.append(local_executor.start_run(module_argv("probe", "exit", "0"), env_for(folder), str(folder), out,
                                              sys.executable, servers))
    assert [type(p).__name__ for p in procs] == ["WarmRun", "WarmRun", "Popen", "Popen"]
    assert len(started) == 1
    for p in procs:
        p.wait(timeout=DEADLINE_S)
    for s in servers.values():
        s.close()

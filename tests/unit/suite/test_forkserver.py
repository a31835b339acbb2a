"""The tests' fork server (tests/forkserver.py) hands back what a `python -m MODULE` subprocess would: exit
status, stdout and stderr apart or merged, the environment and folder asked for, `sys.argv` and `sys.path[0]`
as `-m` sets them, a session of its own, death by a signal as a negative status, the interpreter's exit (atexit
hooks, non-daemon threads), and what the server's imports printed to stderr. The server here preloads a small
module instead of torch, so the file stays cheap; trainutil decides which runs it serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import forkserver
import trainutil

PROBE = '''
import atexit, json, os, signal, sys, threading, time
mode = sys.argv[1]
if mode == "report":
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
                      "sid": os.getsid(0) == os.getpid(), "env": os.environ.get("PROBE_VALUE"),
                      "stdin": sys.stdin.read()}))
    print("to stderr", file=sys.stderr)
    sys.exit(7)
if mode == "exit-hooks":
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished", flush=True))).start()
    print("main done", flush=True)
if mode == "wait":
    print("waiting", flush=True)
    time.sleep(600)
if mode == "raise":
    raise ValueError("boom")
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("forkserver")
    (folder / "probe.py").write_text(PROBE)
    (folder / "noisy.py").write_text("import sys\nprint('noisy at import', file=sys.stderr)\n")
    env = {**trainutil.env(), "PYTHONPATH": str(folder)}
    client = forkserver.Client(sys.executable, env, str(folder), preload=("json", "noisy"))
    yield client, folder, env
    client.stop()


def start(server, *args: str, merge: bool = False, **extra: str) -> forkserver.Forked:
    client, folder, env = server
    return client.start([sys.executable, "-m", "probe", *args], {**env, **extra}, str(folder), merge)


def test_a_child_reports_as_the_subprocess_would(server):
    proc = start(server, "report", "x=1", PROBE_VALUE="seen")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7
    report = json.loads(out)
    folder = str(server[1])
    assert report == {"argv": ["report", "x=1"], "cwd": folder, "path0": folder, "name": "__main__",
                      "sid": True, "env": "seen", "stdin": ""}
    assert err == "noisy at import\nto stderr\n"  # the server's import-time output comes first, as it would


def test_merged_streams_exit_hooks_and_threads(server):
    proc = start(server, "exit-hooks", merge=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err is None
    assert out.splitlines() == ["noisy at import", "main done", "thread finished", "atexit ran"]


def test_an_uncaught_exception_is_a_traceback_and_status_1(server):
    proc = start(server, "raise")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" in err and "ValueError: boom" in err


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_signal_to_the_childs_group_ends_it_with_a_negative_status(server, sig):
    proc = start(server, "wait", merge=True)
    assert proc.stdout.readline() == "noisy at import\n" and proc.stdout.readline() == "waiting\n"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)
    os.killpg(proc.pid, sig)  # its own session: the test's process group is not touched
    assert proc.wait(timeout=60) == -sig
    proc.communicate(timeout=60)


def test_communicate_times_out_and_a_kill_then_ends_it(server):
    proc = start(server, "wait")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.5)
    proc.kill()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and out == "waiting\n"


def test_trainutil_forks_only_what_a_fresh_interpreter_would_start_alike(server, monkeypatch):
    client, _, env = server
    assert client.serves(env)
    assert not client.serves({**env, "OMP_NUM_THREADS": "2"})  # read when torch starts
    assert not client.serves({k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert client.serves({**env, "RRTRAIN_CONFIGS": "/elsewhere"})  # read by rrtrain when it runs
    monkeypatch.delenv("RRTRAIN_TEST_TIER", raising=False)
    monkeypatch.delenv(forkserver.ENV_SWITCH, raising=False)
    cmd = [trainutil.PY, "-m", "rrtrain.train", trainutil.TINY]
    assert trainutil._forks(cmd) and not trainutil._forks([trainutil.PY, "-m", "rrtrain", "sweep"])
    monkeypatch.setenv(forkserver.ENV_SWITCH, "0")
    assert not trainutil._forks(cmd)
    monkeypatch.delenv(forkserver.ENV_SWITCH)
    monkeypatch.setenv("RRTRAIN_TEST_TIER", "fast")  # the fast tier's guard watches Popen
    assert not trainutil._forks(cmd)


def test_the_server_ends_with_its_client_and_takes_its_children(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    client = forkserver.Client(sys.executable, trainutil.env(), str(tmp_path), preload=())
    proc = client.start([sys.executable, "-m", "probe", "wait"], trainutil.env(), str(tmp_path), True)
    assert proc.stdout.readline() == "waiting\n"
    client.stop()
    assert client.proc.returncode == 0 and not Path(client.folder).exists()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(proc.pid):
        time.sleep(0.05)
    assert not _alive(proc.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_per_startup_environment_from_its_second_run(monkeypatch):
    """This process's own start-up environment is served from the first run; another (a library that set
    KMP_INIT_AT_FORK in os.environ, a test's PYTHONPATH) from its second, at most MAX_SERVERS in all."""
    started = []

    class Fake:
        def __init__(self, python, env, cwd):  # noqa: ANN001
            self.env = env
            started.append(forkserver.startup_env(env))

        def serves(self, env) -> bool:  # noqa: ANN001
            return forkserver.startup_env(env) == forkserver.startup_env(self.env)

    monkeypatch.setattr(trainutil.forkserver, "Client", Fake)
    monkeypatch.setattr(trainutil, "_servers", {})
    monkeypatch.setattr(trainutil, "_asked", {})
    monkeypatch.setattr(trainutil, "_failed", set())
    own = trainutil.env()  # as this process's environment is now (a test before may have changed it)
    monkeypatch.setattr(trainutil, "_DEFAULT", frozenset(forkserver.startup_env(own).items()))
    assert trainutil._server_for(own) is trainutil._server_for(own) is not None and len(started) == 1
    other = {**own, "KMP_RRTRAIN_TEST": "x"}  # a name no library sets
    assert trainutil._server_for(other) is None and len(started) == 1
    assert trainutil._server_for(other) is not None and started[-1]["KMP_RRTRAIN_TEST"] == "x"
    for i in range(4):
        trainutil._server_for({**own, "PYTHONPATH": f"/rrtrain-test-lib{i}"})
        trainutil._server_for({**own, "PYTHONPATH": f"/rrtrain-test-lib{i}"})
    assert len(started) == trainutil.MAX_SERVERS

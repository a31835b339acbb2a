"""`--executor local`: the sweep's runs as subprocesses on this machine, N at a time, a log file per run
(appended across attempts). The same command a Slurm array task runs; nothing is requeued."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Callable, Optional, Union

from launchers.executors import warm
from launchers.executors.base import ArrayTask, Interrupted, SubmitError, Submitted
from launchers.executors.entry import config_path
from launchers.executors.render import train_argv
from launchers.sweep.expand import Run
from launchers.sweep import seal
from launchers.sweep.snapshot import NO_BYTECODE
from rrtrain.config_load import CONFIG_DIGEST_ENV
from rrtrain.core import files
from rrtrain.core.child_python import MODULE_AT, child_env
from rrtrain.core.errors import UsageError

#: seconds between two calls of `on_poll` (the cancellation of flagged runs) while runs are going
POLL_EVERY_S = 10.0


def submit(runs: list[Run], python: str, code: str, configs: dict[str, Path], logs: Path, parallel: int,
           on_poll: Optional[Callable[[], object]] = None) -> tuple[dict[str, Optional[str]], dict[str, int]]:
    """Run every run to its end, calling `on_poll` every POLL_EVERY_S; returns (job id per run, exit status per run).
    The snapshot and each config are bound now (`launchers.sweep.seal`) and checked again before each run
    starts, however much later: a run whose code or config changed meanwhile is refused (exit status 2, its
    final.json saying why), never started."""
    bound = seal.bind(code, {run.id: configs[run.id] for run in runs})
    logs_fd = open_logs_dir(logs)
    queue = list(runs)
    running: dict[str, tuple[Union[subprocess.Popen, warm.WarmRun], IO]] = {}
    servers: dict[frozenset, Optional[warm.WarmServer]] = {}
    jobs: dict[str, Optional[str]] = {}
    codes: dict[str, int] = {}
    polled = time.monotonic()
    try:
        while queue or running:
            while queue and len(running) < parallel:
                run = queue.pop(0)
                why = seal.problem(code, bound.code_sha256, str(configs[run.id]), bound.configs[run.id])
                if why is not None:  # the snapshot or the config changed since `rrtrain sweep` bound them
                    print(seal.refusal(why), file=sys.stderr, flush=True)
                    seal.record_refusal(str(run.dir), why)
                    codes[run.id] = 2
                    continue
                env = child_env()  # nothing imported from the current directory (rrtrain.core.child_python)
                env[CONFIG_DIGEST_ENV] = bound.configs[run.id]  # the trainer parses only the bytes bound here
                env["PYTHONPATH"] = code + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
                env.setdefault("OMP_NUM_THREADS", str(run.resources.cpus_per_task))
                env["PYTHONUNBUFFERED"] = "1"
                env.update(NO_BYTECODE)  # importing from the snapshot adds nothing to it (launchers.sweep.snapshot)
                log_path = logs / f"{run.id}.log"
                log = open_log(logs_fd, log_path)
                log.write(f"=== rrtrain sweep (local): {run.id}, {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
                log.flush()
                proc = start_run(train_argv(run, python, configs[run.id]), env, code, log, python, servers)
                running[run.id] = (proc, log)
                jobs[run.id] = f"local:{proc.pid}"
                how = ", forked by the warm interpreter" if isinstance(proc, warm.WarmRun) else ""
                print(f"[local] started {run.id} (pid {proc.pid}{how}, log {log_path})", flush=True)
            for rid, (proc, log) in list(running.items()):
                if proc.poll() is not None:
                    log.close()
                    codes[rid] = proc.returncode
                    del running[rid]
                    print(f"[local] {rid} ended with exit status {proc.returncode}", flush=True)
            if on_poll is not None and running and time.monotonic() - polled >= POLL_EVERY_S:
                on_poll()
                polled = time.monotonic()
            time.sleep(0.2)
    finally:
        for rid, (proc, log) in running.items():  # interrupted: stop the runs (they checkpoint and exit 75)
            proc.terminate()
        for rid, (proc, log) in running.items():
            try:
                codes[rid] = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[rid] = proc.wait()
            log.close()
        for server in servers.values():
            if server is not None:
                server.close()
        os.close(logs_fd)
    return jobs, codes


def start_run(argv: list[str], env: dict[str, str], code: str, log: IO, python: str,
              servers: dict[frozenset, Optional[warm.WarmServer]]) -> Union[subprocess.Popen, warm.WarmRun]:
    """Start one run's command: a one-process run forked by the warm server for its environment (started on
    first use; `launchers.executors.warm`), anything else, or everything under RRTRAIN_WARM_START=0, as a
    subprocess. A server that could not start a run is not asked again: that run and the rest start plainly."""
    if argv[MODULE_AT:MODULE_AT + 1] == [warm.MODULE] and warm.enabled():
        key = warm.server_key(env)
        if key not in servers:
            servers[key] = warm.WarmServer(python, env, code)
        server = servers[key]
        if server is not None:
            try:
                return warm.WarmRun(server, server.start(argv[MODULE_AT + 1:], env, code, log.fileno()))
            except RuntimeError as err:
                print(f"[local] {err}: runs start as plain subprocesses", file=sys.stderr, flush=True)
                server.close()  # its socket and its process (ended: reaped at once)
                servers[key] = None
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=code)


class LocalExecutor:
    """`--executor local` behind the one interface (`launchers.executors.base.Executor`): `parallel` runs at a time
    with `python`, calling `on_poll` every POLL_EVERY_S while runs are going (the cancellation of flagged runs,
    with `monitor: {cancel: true}`); returns once every run ended."""

    name = "local"
    waits = True

    def __init__(self, python: str, parallel: int, on_poll: Optional[Callable[[], object]] = None) -> None:
        self.python, self.parallel, self.on_poll = python, parallel, on_poll

    def run_array(self, task: ArrayTask, count: int, folder: Path, label: str) -> dict[int, Optional[str]]:
        """`launchers.executors.base.ArrayExecutor`: the tasks as subprocesses here, `parallel` at a time."""
        code = str(Path(__file__).resolve().parents[2])  # this very code first on the tasks' import path
        path = code + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
        return run_array(task, count, self.python, Path(folder), self.parallel, label, env={"PYTHONPATH": path})

    def submit(self, runs: list[Run], sweep_dir: Path, name: str, code: str) -> Submitted:
        configs = {r.id: config_path(sweep_dir, r.id) for r in runs}
        try:
            return Submitted(*submit(runs, self.python, code, configs, Path(sweep_dir) / "slurm" / "logs",
                                     self.parallel, on_poll=self.on_poll))
        except KeyboardInterrupt:
            print("interrupted: the running runs were stopped at a step boundary; submit again to resume them")
            raise Interrupted() from None


def run_array(task: ArrayTask, count: int, python: str, logs: Path, parallel: int, label: str,
              env: Optional[dict[str, str]] = None) -> dict[int, Optional[str]]:
    """Tasks 0..count-1 of `task` as subprocesses, `parallel` at a time, each with a log `logs/task-I.log`; waits for
    all. A task that exits non-zero stops the others (terminated) and is a SubmitError with its log's last line."""
    logs_fd = open_logs_dir(logs)
    queue = list(range(count))
    running: dict[int, tuple[subprocess.Popen, IO, Path]] = {}
    jobs: dict[int, Optional[str]] = {}
    failed: Optional[str] = None
    try:
        while (queue or running) and failed is None:
            while queue and len(running) < parallel:
                i = queue.pop(0)
                path = logs / f"task-{i}.log"
                log = open_log(logs_fd, path)
                proc = subprocess.Popen(task.argv(python, i), stdout=log, stderr=subprocess.STDOUT,
                                        env={**child_env(), **(env or {}), "PYTHONUNBUFFERED": "1"})
                running[i] = (proc, log, path)
                jobs[i] = f"local:{proc.pid}"
            for i, (proc, log, path) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[i]
                if proc.returncode != 0:
                    failed = f"{label} task {i} of {count} exited {proc.returncode}: {last_line(logs_fd, path)}"
            time.sleep(0.1)
    except KeyboardInterrupt:
        raise Interrupted() from None
    finally:
        for proc, log, _ in running.values():  # a failure or Ctrl-C: the others are stopped, not left running
            proc.terminate()
        for proc, log, _ in running.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        os.close(logs_fd)
    if failed is not None:
        raise SubmitError(failed, {str(i): j for i, j in jobs.items()})
    return jobs


def last_line(logs_fd: int, path: Path) -> str:
    """The last non-empty line of a task's log (its one-line error), read by the layer; a placeholder otherwise."""
    try:
        with os.fdopen(files.open_beneath(logs_fd, path.name), "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 8192))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    found = [line.strip() for line in text.splitlines() if line.strip()]
    return found[-1][:500] if found else "(no output)"


def open_logs_dir(logs: Path) -> int:
    """A descriptor of the logs directory, created when missing, never through a symbolic link (neither `logs`
    nor its parent: a planted link would put every run's log, and what it appends to, elsewhere)."""
    if logs.parent.is_symlink() or logs.is_symlink():
        raise UsageError(f"{logs.parent if logs.parent.is_symlink() else logs} is a symbolic link: the runs' logs "
                         "are written only in a directory of the sweep's own; remove the link")
    try:
        files.make_dirs(logs)
        return files.open_dir(logs)
    except OSError as err:
        raise UsageError(f"cannot open the logs directory {logs}: {err.strerror or type(err).__name__}") from None


def open_log(logs_fd: int, path: Path) -> IO:
    """The run's log opened for appending in the logs directory, never through a symbolic link and only as a
    regular file (a FIFO would block the sweep); otherwise the run's output is discarded, said in one line, and
    what is at that name is left as it is."""
    try:
        return os.fdopen(files.open_beneath(logs_fd, path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                            files.file_mode()), "a")
    except files.LinkRefused:
        what = "a symbolic link"
    except files.NotRegular:
        what = "not a regular file"
    except OSError as err:
        what = f"not writable ({err.strerror or err})"
    print(f"[local] {path} is {what}: not followed; this run's output is discarded (remove it to keep logs)",
          flush=True)
    return open(os.devnull, "a")

"""`--executor local`: the sweep's runs as subprocesses on this machine, N at a time, a log file per run
(appended across attempts). The same command a Slurm array task runs; nothing is requeued."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import IO, Callable, Optional

from launchers.expand import Run
from launchers.render import train_argv

#: seconds between two calls of `on_poll` (the cancellation of flagged runs) while runs are going
POLL_EVERY_S = 10.0


def submit(runs: list[Run], python: str, code: str, configs: dict[str, Path], logs: Path, parallel: int,
           on_poll: Optional[Callable[[], object]] = None) -> tuple[dict[str, Optional[str]], dict[str, int]]:
    """Run every run to its end, calling `on_poll` every POLL_EVERY_S; returns (job id per run, exit status per run)."""
    logs.mkdir(parents=True, exist_ok=True)
    queue = list(runs)
    running: dict[str, tuple[subprocess.Popen, IO]] = {}
    jobs: dict[str, Optional[str]] = {}
    codes: dict[str, int] = {}
    polled = time.monotonic()
    try:
        while queue or running:
            while queue and len(running) < parallel:
                run = queue.pop(0)
                env = dict(os.environ)
                env["PYTHONPATH"] = code + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
                env.setdefault("OMP_NUM_THREADS", str(run.resources.cpus_per_task))
                env["PYTHONUNBUFFERED"] = "1"
                log_path = logs / f"{run.id}.log"
                log = open(log_path, "a")
                log.write(f"=== rrtrain sweep (local): {run.id}, {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
                log.flush()
                proc = subprocess.Popen(train_argv(run, python, configs[run.id]), stdout=log,
                                        stderr=subprocess.STDOUT, env=env, cwd=code)
                running[run.id] = (proc, log)
                jobs[run.id] = f"local:{proc.pid}"
                print(f"[local] started {run.id} (pid {proc.pid}, log {log_path})", flush=True)
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
    return jobs, codes

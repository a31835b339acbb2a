"""Start-up of a one-step tiny run: wall time, time to the first step, peak RSS and private memory per process.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_startup.py   (or `make bench`)

A vs B in one sitting, interleaved, three runs each, medians:
  A "import streaming first": the process imports the whole `streaming` package before the run, as the
    trainer did before its streaming imports were deferred (transformers and torchvision come with it);
  B "as shipped": `python -m rrtrain.train` as it is;
  D "collector on": B with the cyclic collector running through the start-up, as before the run's process paused
    it until its first step (rrtrain.train's module is run under another name and its main called as
    `python -m` calls it, so its pause never starts).
Time to the first step is the first training line's appearance in metrics.jsonl after the process started
(polled every 10 ms). Private memory (anonymous + private file pages at exit, /proc smaps_rollup) is what a
process really adds on a node; RSS also counts the pages of shared libraries (torch's CUDA build alone maps
~0.45 GB of them), which all ranks of a node share; PSS (proportional set size) divides each shared page among
the processes that map it, so on an 8-rank node it approaches the private figure. CPU s is the process's own
user + sys time, which other jobs on a shared machine disturb far less than the wall clock.
  C (only when RRTRAIN_STARTUP_PYTHON names another interpreter, e.g. a scratch venv with a CPU-only torch
    wheel that also sees this venv's other packages): B under that interpreter, to price torch's CUDA build.
Targets (issue 15): <= 4 s wall, <= 500 MB per process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from trainutil import PY, REPO, TINY, env

_RUN = """
import atexit, json, resource, runpy, sys
out, mode = sys.argv[1], sys.argv[2]
if mode == "streaming":
    import streaming  # noqa: F401
def report():
    smaps = dict(l.split(":", 1) for l in open("/proc/self/smaps_rollup").read().splitlines()[1:])
    kb = lambda k: int(smaps[k].split()[0])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    json.dump({"maxrss_mb": usage.ru_maxrss / 1024, "rss_mb": kb("Rss") / 1024, "pss_mb": kb("Pss") / 1024,
               "private_mb": (kb("Private_Dirty") + kb("Private_Clean")) / 1024,
               "cpu_s": usage.ru_utime + usage.ru_stime}, open(out, "w"))
atexit.register(report)
sys.argv = ["rrtrain.train", *sys.argv[3:]]
if mode == "collector":
    from rrtrain.core.command import run_command
    train = runpy.run_module("rrtrain.train", run_name="rrtrain_train_collector_on")
    sys.exit(run_command("rrtrain train", train["main"], sys.argv[1:]))
runpy.run_module("rrtrain.train", run_name="__main__")
"""


def one_run(tmp: Path, data: Path, mode: str, i: int, python: str = PY) -> dict:
    run_dir, out = tmp / f"run-{mode}-{i}-{python == PY}", tmp / f"mem-{mode}-{i}-{python == PY}.json"
    metrics = run_dir / "metrics.jsonl"
    cmd = [python, "-c", _RUN, str(out), mode, TINY, f"data.path={data}", f"run.dir={run_dir}",
           "train.max_steps=1", "data.eval_batches=1"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
        if first is None and metrics.exists() and metrics.stat().st_size > 0:
            first = time.perf_counter() - t0
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr.read()[-3000:]
    return {"wall_s": wall, "first_step_s": first if first is not None else wall, **json.loads(out.read_text())}


def test_one_step_tiny_run_startup(tmp_path, stories_data):
    alt = os.environ.get("RRTRAIN_STARTUP_PYTHON")
    variants = [("A: import streaming first (before)", "streaming", PY), ("B: as shipped", "", PY),
                ("D: the collector on through start-up (before)", "collector", PY)]
    if alt:
        variants.append((f"C: as shipped, {alt}", "", alt))
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    for i in range(3):
        for name, mode, python in variants:
            runs[name].append(one_run(tmp_path, stories_data, mode, i, python))
    print("\n| one-step tiny run | wall s | to first step s | CPU s | peak RSS MB | RSS / PSS / private MB at exit |")
    print("|---|---|---|---|---|---|")
    for name, _, _ in variants:
        med = {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        print(f"| {name} | {med['wall_s']:.2f} | {med['first_step_s']:.2f} | {med['cpu_s']:.2f} | "
              f"{med['maxrss_mb']:.0f} | {med['rss_mb']:.0f} / {med['pss_mb']:.0f} / {med['private_mb']:.0f} |")

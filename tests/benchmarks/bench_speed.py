"""Step time by the trainer's own logged tokens/s, default settings: every rule against `standard` and its FLOPs,
and `standard`'s model FLOP/s against the CPU matmul peak measured in the same process.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_speed.py   (or `make bench`)
      RRTRAIN_BENCH_STEPS=N ... runs every test for N steps instead of its own length (below)
      RRTRAIN_BENCH_DIR=D RRTRAIN_BENCH_SITTING_S=S ... -k beside_...: a side-by-side run longer than one sitting:
          its data and runs are kept in D; after S seconds both runs are stopped by SIGTERM (each saves a
          checkpoint and exits as preempted) and the test is skipped, saying where they are; the same command
          later continues them exactly (the trainer's resume) until both are done, then reports as usual

Each run is `rrtrain train` on the synthetic stories (byte data) with the defaults (train.compile=auto: eager
on CPU), one thread; tokens/s is the median of its logged `tokens_per_s` windows after the first
(`train.log_every` steps each, evaluation and checkpoints off). Step-time ratio of a rule = standard's tokens/s
/ the rule's; FLOP ratio = `sizing.flops_per_token` of the rule / standard's (6 x matmul weights + attention),
at the same shape (no parameter matching). `standard` runs first and last and its mean is used, so a drift
of the machine's speed during the sitting shows up as the difference between those two. The logged tokens/s
is wall-clock based; on a shared machine the table also gives the ratio of CPU time per step (user + sys of
the `rrtrain train` process, less that of a one-step run of the same configuration, over the steps after the
first), which other jobs disturb much less.

1. tiny (d_model 64, 4 blocks, seq 64, batch 16): review against standard for 2,000 steps (the issue's
   length), and the table for every rule (300 steps).
2. ~20M (d_model 384, 8 blocks, 6 heads, d_ff 1536, seq 256, batch 4, vocab 8192): standard and review,
   100 steps (2,000 would take about 50 min of CPU time a run on one thread); and the two side by side, one
   processor each, 300 steps (`RRTRAIN_BENCH_STEPS=2000 ... -k beside_standard_20m`: the issue's length in ~65 min).
3. rr-60m at its real shape (d_model 512, 8 blocks, 8 heads, seq 1024, vocab 50257), one sequence per step:
   standard and review, 20 steps (a step takes ~10 s on one CPU thread); and the two side by side, 20 steps
   (`RRTRAIN_BENCH_STEPS=300 ... -k beside_standard_rr60m`, log every 2 steps: 28 min; the issue's 2,000
   steps take ~3 h, more than one sitting: RRTRAIN_BENCH_DIR and RRTRAIN_BENCH_SITTING_S, above).
4. standard at d_model 128, 4 blocks, 4 heads, seq 64, batch 12, fp32, two threads, 2,000 steps: logged MFU =
   tokens/s x FLOPs per token / the peak the trainer probes in the same process
   (`rrtrain.core.hardware.cpu_peak_flops`, same thread count); target >= 65%.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from rrtrain import residuals, sizing
from rrtrain.core.io import atomic_write_text
from trainutil import REPO, env, prep_stories, records, train, train_cmd

STEPS = int(os.environ.get("RRTRAIN_BENCH_STEPS", "0"))
KEEP = os.environ.get("RRTRAIN_BENCH_DIR")  # side-by-side runs over several sittings: see the module's docstring
SITTING_S = float(os.environ.get("RRTRAIN_BENCH_SITTING_S", "0"))
BASE = ["train.eval_every=0", "train.ckpt_every=0", "data.eval_batches=1", "train.warmup_steps=5"]
M20 = ["model.d_model=384", "model.n_layers=8", "model.n_heads=6", "model.d_ff=1536", "model.vocab_size=8192",
       "train.global_batch=4", "train.micro_batch=4"]
RR60M = ["model.size=rr-60m", "model.vocab_size=50257", "train.global_batch=1", "train.micro_batch=1"]
D128 = ["model.variant=standard", "model.d_model=128", "model.n_layers=4", "model.n_heads=4", "model.d_ff=512",
        "train.global_batch=12", "train.micro_batch=12", "parallel.precision=fp32"]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(tmp: Path, data: Path, name: str, steps: int, log_every: int, *overrides: str) -> dict:
    run_dir = tmp / name
    cpu0 = children_cpu_s()
    train(run_dir, data, *BASE, f"train.max_steps={STEPS or steps}", f"train.log_every={log_every}", *overrides,
          timeout=7200)
    return summary(run_dir, children_cpu_s() - cpu0, overrides)


def summary(run_dir: Path, cpu_s: float, overrides: tuple[str, ...]) -> dict:
    """A finished run's median logged tokens/s and MFU, its FLOPs per token and parameters, and `cpu_s`."""
    logged = [r for r in records(run_dir) if "tokens_per_s" in r][1:]  # the first window holds the warm-up
    fin = json.loads((run_dir / "final.json").read_text())
    shape = sizing.ModelShape(**fin["shape"])
    variant = next(o.split("=", 1)[1] for o in overrides if o.startswith("model.variant="))
    return {"tps": statistics.median(r["tokens_per_s"] for r in logged),
            "mfu": statistics.median(r["mfu"] for r in logged),
            "flops": sizing.flops_per_token(shape, variant, dict()), "params": fin["params"],
            "cpu_s": cpu_s}


def step_cpu_s(tmp: Path, data: Path, name: str, r: dict, steps: int, *overrides: str) -> float:
    """CPU time per step of run `r`, net of start-up, the final evaluation and checkpoint: a one-step run of
    the same configuration costs all of those plus one step."""
    steps = STEPS or steps
    one = children_cpu_s()
    train(tmp / f"{name}-1", data, *BASE, "train.max_steps=1", "train.log_every=1", *overrides, timeout=7200)
    return (r["cpu_s"] - (children_cpu_s() - one)) / (steps - 1)


def ratio_table(tmp: Path, data: Path, label: str, variants: list[str], steps: int, log_every: int,
                *overrides: str) -> None:
    first = run(tmp, data, f"{label}-standard-a", steps, log_every, "model.variant=standard", *overrides)
    rows = {v: run(tmp, data, f"{label}-{v}", steps, log_every, f"model.variant={v}", *overrides) for v in variants}
    last = run(tmp, data, f"{label}-standard-b", steps, log_every, "model.variant=standard", *overrides)
    std_tps = (first["tps"] + last["tps"]) / 2
    std_step = (step_cpu_s(tmp, data, f"{label}-standard-a", first, steps, "model.variant=standard", *overrides)
                + step_cpu_s(tmp, data, f"{label}-standard-b", last, steps, "model.variant=standard", *overrides)) / 2
    print(f"\n{label}: {STEPS or steps} steps, standard {first['tps']:,.0f} then {last['tps']:,.0f} tokens/s, "
          f"{first['cpu_s']:.1f} then {last['cpu_s']:.1f} CPU s")
    print("| rule | params | tokens/s | step-time ratio vs standard (tokens/s) | CPU time per step ratio | "
          "FLOP ratio | excess over FLOPs (tokens/s / CPU) |")
    print("|---|---|---|---|---|---|---|")
    for v, r in rows.items():
        cpu_ratio = step_cpu_s(tmp, data, f"{label}-{v}", r, steps, f"model.variant={v}", *overrides) / std_step
        time_ratio, flop_ratio = std_tps / r["tps"], r["flops"] / first["flops"]
        print(f"| {v} | {r['params'] / 1e6:.2f}M | {r['tps']:,.0f} | {time_ratio:.2f} | {cpu_ratio:.2f} | "
              f"{flop_ratio:.2f} | {time_ratio - flop_ratio:+.2f} / {cpu_ratio - flop_ratio:+.2f} |", flush=True)


def stories(tmp_path_factory: pytest.TempPathFactory, seq_len: int) -> Path:
    """The stories at `seq_len`; under RRTRAIN_BENCH_DIR prepared once and kept (a resumed run needs the same
    data path)."""
    if KEEP:
        out = Path(KEEP) / f"data{seq_len}" / "stories"
        if out.exists():  # prep publishes the whole directory at once
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
    else:
        out = tmp_path_factory.mktemp(f"data{seq_len}") / "stories"
    return prep_stories(out, num_docs=800, seq_len=seq_len)


@pytest.fixture(scope="module")
def data_256(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stories(tmp_path_factory, 256)


@pytest.fixture(scope="module")
def data_1024(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stories(tmp_path_factory, 1024)


TINY_BATCH = ["train.global_batch=16", "train.micro_batch=16"]


def test_review_against_standard_tiny(tmp_path, stories_data):
    ratio_table(tmp_path, stories_data, "tiny", ["review"], 2000, 100, *TINY_BATCH)


def test_every_rule_against_standard_tiny(tmp_path, stories_data):
    rules = [n for n in residuals.names() if n != "standard"]
    ratio_table(tmp_path, stories_data, "tiny", rules, 300, 50, *TINY_BATCH)


def test_review_against_standard_20m(tmp_path, data_256):
    ratio_table(tmp_path, data_256, "20M", ["review"], 100, 10, *M20)


def start_pinned(run_dir: Path, data: Path, core: int, *overrides: str) -> subprocess.Popen:
    """`rrtrain train` (one thread) allowed on processor `core` only; its output goes to RUN_DIR.log."""
    with open(run_dir.with_suffix(".log"), "w") as log:
        return subprocess.Popen(train_cmd(run_dir, data, [*BASE, *overrides]), cwd=REPO, env=env(),
                                stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: os.sched_setaffinity(0, {core}))


def reap(proc: subprocess.Popen, run_dir: Path, ok: tuple[int, ...] = (0,)) -> tuple[int, float]:
    """Wait for `proc` (its exit status must be in `ok`: else its output's tail); its exit status and user +
    system CPU seconds."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode in ok, f"exit {proc.returncode}\n{run_dir.with_suffix('.log').read_text()[-3000:]}"
    return proc.returncode, usage.ru_utime + usage.ru_stime


def wait_cpu_s(proc: subprocess.Popen, run_dir: Path) -> float:
    """Reap `proc` (it must succeed) and return its user + system CPU seconds."""
    return reap(proc, run_dir)[1]


def running(proc: subprocess.Popen) -> bool:
    """Whether `proc` has not exited, without reaping it (`reap` needs its resource usage)."""
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


def sittings(run_dir: Path) -> list[list[float]]:
    """[exit status, CPU seconds] of each sitting of a kept run so far."""
    path = run_dir.with_suffix(".sittings.json")
    return json.loads(path.read_text()) if path.exists() else []


def run_sitting(runs: dict[str, tuple[Path, int, list[str]]], data: Path) -> dict[str, list[list[float]]]:
    """One sitting of the side-by-side runs `{variant: (run_dir, core, overrides)}`: each run not finished in
    an earlier sitting starts (or resumes from its checkpoint); after RRTRAIN_BENCH_SITTING_S seconds the runs
    still going get SIGTERM. Each run's sittings so far, this one's appended (kept beside it under KEEP)."""
    procs = {v: start_pinned(d, data, core, *o) for v, (d, core, o) in runs.items()
             if not sittings(d) or sittings(d)[-1][0] != 0}
    if KEEP and SITTING_S:
        deadline = time.monotonic() + SITTING_S
        while any(map(running, procs.values())) and time.monotonic() < deadline:
            time.sleep(1.0)
        for p in procs.values():
            if running(p):
                p.send_signal(signal.SIGTERM)  # stops at its next stop check, checkpointed: exit 75
    out = {}
    for v, (d, _, _) in runs.items():
        done = sittings(d)
        if v in procs:
            done.append(list(reap(procs[v], d, (0, 75) if KEEP else (0,))))
            if KEEP:
                atomic_write_text(d.with_suffix(".sittings.json"), json.dumps(done))
        out[v] = done
    return out


def beside(tmp: Path, data: Path, label: str, steps: int, log_every: int, *overrides: str) -> None:
    """standard and review at the same time, each one thread on a processor of its own: a drift of the
    machine's speed, or another job, falls on both alike instead of on one after the other. CPU time per
    step is net of a one-step run of each, run afterwards on the same processor, once per sitting (each
    sitting starts, resumes and checkpoints once)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two processors")
    steps = STEPS or steps
    where = Path(KEEP) if KEEP else tmp
    keep = ["train.ckpt_every=100"] if KEEP else []  # an unplanned end of a sitting loses at most 100 steps
    runs = {v: (where / f"{label}-{v}", cores[i], [f"train.max_steps={steps}", f"train.log_every={log_every}",
                                                   *keep, f"model.variant={v}", *overrides])
            for i, v in enumerate(("standard", "review"))}
    done = run_sitting(runs, data)
    if any(d[-1][0] != 0 for d in done.values()):
        windows = {v: [r["tokens_per_s"] for r in records(runs[v][0]) if "tokens_per_s" in r][1:] for v in runs}
        so_far = {v: statistics.median(w) if w else float("nan") for v, w in windows.items()}
        at = ", ".join(f"{v} at step {records(runs[v][0])[-1]['step']} ({so_far[v]:,.1f} tokens/s so far)"
                       for v in runs)
        pytest.skip(f"sitting over: {at} of {steps}, step-time ratio so far "
                    f"{so_far['standard'] / so_far['review']:.3f}; the same command continues them")
    net = {}
    for v, (d, core, o) in runs.items():
        one = tmp / f"{label}-{v}-1"
        one_cpu = wait_cpu_s(start_pinned(one, data, core, "train.max_steps=1", "train.log_every=1", *o[2:]), one)
        k = len(done[v])
        net[v] = (sum(cpu for _, cpu in done[v]) - k * one_cpu) / (steps - k)
    s, r = (summary(runs[v][0], sum(cpu for _, cpu in done[v]), tuple(runs[v][2])) for v in ("standard", "review"))
    time_ratio, cpu_ratio, flop_ratio = s["tps"] / r["tps"], net["review"] / net["standard"], r["flops"] / s["flops"]
    print(f"\n{label}, side by side on processors {cores[0]} and {cores[1]}, {steps} steps in "
          f"{len(done['standard'])} and {len(done['review'])} sittings: standard "
          f"{s['tps']:,.0f} tokens/s ({net['standard']:.3f} CPU s/step), review {r['tps']:,.0f} "
          f"({net['review']:.3f}); step-time ratio {time_ratio:.3f} by tokens/s, {cpu_ratio:.3f} by CPU time; "
          f"FLOP ratio {flop_ratio:.3f}; excess {time_ratio - flop_ratio:+.3f} / {cpu_ratio - flop_ratio:+.3f}")


def test_review_beside_standard_20m(tmp_path, data_256):
    beside(tmp_path, data_256, "20M", 300, 50, *M20)


def test_review_against_standard_rr60m(tmp_path, data_1024):
    ratio_table(tmp_path, data_1024, "rr-60m", ["review"], 20, 2, *RR60M)


def test_review_beside_standard_rr60m(tmp_path, data_1024):
    beside(tmp_path, data_1024, "rr-60m", 20, 2, *RR60M)


def test_standard_d128_against_the_matmul_peak(tmp_path, stories_data, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the setting; trainutil.env() keeps a value already set
    r = run(tmp_path, stories_data, "d128", 2000, 100, *D128)
    print(f"\nstandard d128, 2 threads: {r['tps']:,.0f} tokens/s x {r['flops'] / 1e6:.2f} MFLOP/token = "
          f"{r['tps'] * r['flops'] / 1e9:.1f} GFLOP/s; logged MFU (vs the in-process matmul probe) {100 * r['mfu']:.1f}%")

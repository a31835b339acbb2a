"""When compiling pays: inductor's compile time against the step time it saves, on this machine's CPU.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_compile.py   (or `make bench`)
      RRTRAIN_BENCH_SHAPES=tiny,20M ... to measure only some shapes (rr-60m takes the longest)

For each shape and rule, one fresh process per mode (one thread, random tokens, whole optimizer steps as
`rrtrain bench` runs them): set-up plus the first step (compilation included when compiled: the whole call
less the timed steps) and the median of the next steps, in wall-clock and in CPU time (the process's own plus
its children's: inductor compiles in worker processes). "compiled, cold" starts from an empty inductor cache;
"compiled, warm" is a second process on the cache the first one left (what every later run of the same shape
on the same machine pays). Break-even = (first compiled - first eager) / (eager step - compiled step) steps:
a run longer than that finishes sooner compiled. `rrtrain/parallel/compile_policy.py`'s CPU rule comes from these.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

from trainutil import PY, REPO, TINY, env

M20 = ["model.d_model=384", "model.n_layers=8", "model.n_heads=6", "model.d_ff=1536", "model.seq_len=256",
       "model.vocab_size=8192", "train.global_batch=4", "train.micro_batch=4"]
#: the rr-60m preset at its real shape (seq 1024, vocab 50257) with one sequence per step, so a step fits here
RR60M = ["model.size=rr-60m", "train.global_batch=1", "train.micro_batch=1"]
SHAPES = {"tiny": (["model.vocab_size=258"], 20), "20M": (M20, 5), "rr-60m": (RR60M, 4)}

_STEPS = """
import json, resource, sys, time
from rrtrain.planning.bench import run_bench
from rrtrain.config import load_config

def cpu():
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime

cfg, steps = load_config(sys.argv[1], sys.argv[3:]), int(sys.argv[2])
t0, c0 = time.perf_counter(), cpu()
r = run_bench(cfg, steps=steps, warmup=1)
wall, cpu_s = time.perf_counter() - t0, cpu() - c0
print(json.dumps({"first_s": wall - steps * r["step_time_s"], "step_s": r["step_time_median_s"],
                  "first_cpu_s": cpu_s - steps * r["step_cpu_time_s"], "step_cpu_s": r["step_cpu_time_s"]}))
"""


def measure(shape: list[str], variant: str, compiled: bool, steps: int, cache: str) -> dict:
    cmd = [PY, "-c", _STEPS, TINY, str(steps), *shape, f"model.variant={variant}",
           f"train.compile={'true' if compiled else 'false'}"]
    proc = subprocess.run(cmd, cwd=REPO, env={**env(), "TORCHINDUCTOR_CACHE_DIR": cache}, capture_output=True,
                          text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def break_even(eager: dict, comp: dict, key: str) -> str:
    saving = eager[f"step{key}"] - comp[f"step{key}"]
    if saving <= 0:
        return "never"
    return f"{max(0.0, comp[f'first{key}'] - eager[f'first{key}']) / saving:,.0f}"


def test_compile_break_even():
    wanted = os.environ.get("RRTRAIN_BENCH_SHAPES", ",".join(SHAPES)).split(",")
    print("\n| shape | rule | mode | set-up + first step s (wall / CPU) | later step s (wall / CPU) | "
          "saving per step (CPU) | break-even steps (wall / CPU) |")
    print("|---|---|---|---|---|---|---|")
    for name in wanted:
        shape, steps = SHAPES[name]
        for variant in ("standard", "review"):
            with tempfile.TemporaryDirectory(prefix="rrtrain-inductor-") as cache:
                eager = measure(shape, variant, False, steps, cache)
                rows = [("eager", eager), ("compiled, cold", measure(shape, variant, True, steps, cache)),
                        ("compiled, warm", measure(shape, variant, True, steps, cache))]
            for mode, r in rows:
                saving = 1 - r["step_cpu_s"] / eager["step_cpu_s"]
                even = "" if r is eager else f"{break_even(eager, r, '_s')} / {break_even(eager, r, '_cpu_s')}"
                print(f"| {name} | {variant} | {mode} | {r['first_s']:.1f} / {r['first_cpu_s']:.1f} | "
                      f"{r['step_s']:.4f} / {r['step_cpu_s']:.4f} | {'' if r is eager else f'{100 * saving:.0f}%'} | "
                      f"{even} |", flush=True)

"""When compiling pays: inductor's compile time against the step time it saves, on this machine's CPU.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_compile.py   (or `make bench`)

For each shape and rule, in one fresh process per mode (one thread, random tokens, whole optimizer steps as
`rrtrain bench` runs them): set-up plus the first step (compilation included when compiled: the whole call less the timed steps) and the median of the
next steps. Break-even = (first compiled - first eager) / (eager step - compiled step) steps: a run longer
than that finishes sooner compiled. The `train.compile=auto` rule in docs/performance.md comes from these.
"""

from __future__ import annotations

import json
import subprocess

from trainutil import PY, REPO, TINY, env

SHAPES = {
    "tiny": ["model.vocab_size=258"],
    "20M": ["model.d_model=384", "model.n_layers=8", "model.n_heads=6", "model.d_ff=1536", "model.seq_len=256",
            "model.vocab_size=8192", "train.global_batch=4", "train.micro_batch=4"],
}

_STEPS = """
import json, sys, time
from rrtrain.bench import run_bench
from rrtrain.config import load_config
cfg, steps = load_config(sys.argv[1], sys.argv[3:]), int(sys.argv[2])
t0 = time.perf_counter()
r = run_bench(cfg, steps=steps, warmup=1)
total = time.perf_counter() - t0
print(json.dumps({"first_s": total - steps * r["step_time_s"], "step_s": r["step_time_s"]}))
"""


def measure(shape: list[str], variant: str, compiled: bool, steps: int = 6) -> dict:
    cmd = [PY, "-c", _STEPS, TINY, str(steps), *shape, f"model.variant={variant}",
           f"train.compile={'true' if compiled else 'false'}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_compile_break_even():
    print("\n| shape | rule | first step eager s | first step compiled s | step eager s | step compiled s | "
          "saving per step | break-even steps |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        for variant in ("standard", "review"):
            e, c = measure(shape, variant, False), measure(shape, variant, True)
            saving = e["step_s"] - c["step_s"]
            even = (c["first_s"] - e["first_s"]) / saving if saving > 0 else float("inf")
            print(f"| {name} | {variant} | {e['first_s']:.2f} | {c['first_s']:.1f} | {e['step_s']:.4f} | "
                  f"{c['step_s']:.4f} | {100 * saving / e['step_s']:.0f}% | {even:,.0f} |", flush=True)

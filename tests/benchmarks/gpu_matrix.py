"""Many `rrtrain bench` measurements in one process, for `gpu.sh`: sizes x variants x compile modes.

    python tests/benchmarks/gpu_matrix.py measure --out R.jsonl --sizes rr-60m rr-1b --variants standard review \
        --compile false true [--budget-s 440] [--steps 8 --warmup 2] [--micro rr-1b=8] [--set key=value ...]
    python tests/benchmarks/gpu_matrix.py render R.jsonl

One process pays for Python, torch and CUDA start-up once; each measurement is `rrtrain.planning.bench.run_bench`, the
trainer's own step (rrtrain/training/step.py), on one fixed batch of random tokens, FSDP2, bf16 by default. Without
torchrun the process is a one-rank process group (FSDP2 needs one). torch.compile's caches are cleared between
measurements, so every compiled measurement compiles static shapes, as a training run does, and none reuses a
graph made for another shape. Each result is appended to R.jsonl as soon as it is measured (a failure or a
skip for want of time as a line too), so `render` can print the table after a timeout.
Exit status of `measure`: 0, 1 when a measurement failed or was skipped, 3 when the process imported a
package the GPU machines lack (streaming, deepspeed, submitit).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "train" / "tiny.yaml"
#: sequences of 1024 tokens per GPU per step without activation checkpointing: 12-32 GiB peak on an H200, so
#: they fit any 40 GB GPU; the larger batches that reach ~40% MFU at rr-1b are MICRO_<size> (docs/performance.md)
DEFAULT_MICRO = {"rr-60m": 16, "rr-150m": 16, "rr-320m": 16, "rr-590m": 8, "rr-1b": 8}
#: not installed on the lent GPU machines: the bench path must not need them
ABSENT_ON_GPU = ("streaming", "deepspeed", "submitit")


def single_rank_env() -> None:
    """Without a launcher, make this process rank 0 of 1 (env:// rendezvous on a free loopback port)."""
    if "RANK" in os.environ:
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def plan(sizes: list[str], variants: list[str], compile_modes: list[str]) -> list[tuple[str, str, str]]:
    """Eager measurements first (cheap: the whole eager table early), then compiled ones from the largest size
    down, so a run short of time loses the small compiled measurements, not rr-1b's. A measurement is skipped
    when less time is left than the last one of its compile mode took."""
    eager = [(s, v, c) for c in compile_modes if c == "false" for s in sizes for v in variants]
    compiled = [(s, v, c) for c in compile_modes if c != "false" for s in reversed(sizes) for v in variants]
    return eager + compiled


def measure(args: argparse.Namespace) -> int:
    start = time.monotonic()  # the budget counts importing torch and starting CUDA too
    single_rank_env()
    import torch

    from rrtrain.core import dist
    from rrtrain.planning.bench import run_bench
    from rrtrain.resolve import load

    micro = {**DEFAULT_MICRO, **dict(_size_value(m) for m in args.micro)}
    info = dist.setup(600)
    out = Path(args.out)
    failed = 0
    spent: dict[str, float] = {}  # wall seconds of the last measurement per compile mode: what still fits
    try:
        for size, variant, compile_mode in plan(args.sizes, args.variants, args.compile):
            row: dict[str, Any] = {"size": size, "variant": variant, "compile_mode": compile_mode}
            left = args.budget_s - (time.monotonic() - start)
            if left < spent.get(compile_mode, 0.0):
                row["skipped"] = f"{left:.0f} s of the time budget left"
            else:
                m = micro.get(size, args.default_micro)
                overrides = [f"model.size={size}", f"model.variant={variant}", "parallel.backend=fsdp",
                             "parallel.precision=bf16", f"train.compile={compile_mode}", f"train.micro_batch={m}",
                             f"train.global_batch={m * info.world_size}", *args.overrides]
                t0 = time.monotonic()
                try:
                    row.update(run_bench(load(TINY, overrides), args.steps, args.warmup, info))
                except Exception as err:  # e.g. CUDA out of memory: report it and measure the rest
                    row["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                    traceback.print_exc()
                spent[compile_mode] = time.monotonic() - t0
                row["wall_s"] = round(spent[compile_mode], 1)
                _release(torch)
            failed += "skipped" in row or "error" in row
            if info.is_main:
                with out.open("a") as f:
                    f.write(json.dumps(row, sort_keys=True) + "\n")
                print(f"gpu_matrix: {size} {variant} compile={compile_mode}: " + _summary(row), file=sys.stderr,
                      flush=True)
    finally:
        dist.teardown()
    imported = sorted({m.split(".")[0] for m in sys.modules} & set(ABSENT_ON_GPU))
    if imported:
        print(f"gpu_matrix: error: the bench path imported {', '.join(imported)}, which the GPU machines lack",
              file=sys.stderr)
        return 3
    return 1 if failed else 0


def _size_value(text: str) -> tuple[str, int]:
    size, _, value = text.partition("=")
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"gpu_matrix: error: --micro expects SIZE=N (N >= 1), got '{text}'")
    return size, int(value)


def _release(torch) -> None:
    """Free the measurement's graphs and memory so the next one starts clean (and compiles static shapes)."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _summary(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return f"skipped ({row['skipped']})"
    if "error" in row:
        return f"FAILED ({row['error']})"
    return (f"{row['tokens_per_s']:,.0f} tokens/s, MFU {100 * row['mfu']:.1f}%, {row['peak_mem_gb']:.1f} GiB, "
            f"step {1000 * row['step_time_s']:.0f} ms ({row['wall_s']} s)")


def render(path: Path, expected: Optional[int]) -> int:
    """The markdown table, the review/standard step-time ratio per size and mode; 1 when rows are missing."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    done = [r for r in rows if "step_time_s" in r]
    order = {s: i for i, s in enumerate(DEFAULT_MICRO)}
    done.sort(key=lambda r: (order.get(r["size"], len(order)), r["size"], r["compile_mode"] != "false", r["variant"]))
    if done:
        r0 = done[0]
        print(f"\nrrtrain bench: {r0['device']} x {r0['world_size']}, FSDP2, {r0['precision']} (fp32 master weights "
              f"and reductions), AC {r0['ac']}, {r0['steps']} timed steps after {r0['warmup']} warm-up")
        print(f"MFU = tokens/s x FLOPs/token / peak; FLOPs/token = 6N + 12 x n_layers x seq_len x d_model (PaLM); "
              f"peak: {r0['peak_source']} = {r0['peak_flops'] / 1e12:.1f} TFLOP/s\n")
        print("| size | variant | params | compile | seqs/GPU x seq | tokens/s/GPU | MFU | peak GiB | step ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in done:
            print(f"| {r['size']} | {r['variant']} | {r['params'] / 1e6:.1f}M | {'yes' if r['compile'] else 'no'} | "
                  f"{r['micro_batch']}x{r['shape']['seq_len']} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | "
                  f"{r['peak_mem_gb']:.1f} | {1000 * r['step_time_s']:.1f} |")
        times = {(r["size"], r["compile_mode"], r["variant"]): r["step_time_s"] for r in done}
        ratios = [(s, c, times[s, c, "review"] / times[s, c, "standard"]) for s, c, v in times
                  if v == "standard" and (s, c, "review") in times]
        if ratios:
            print("\n| size | compile | review / standard step time |\n|---|---|---|")
            for s, c, ratio in ratios:
                print(f"| {s} | {'yes' if c != 'false' else 'no'} | {ratio:.3f} |")
        print("\nanchors (ANCHORS.md §2a, H100 bf16): ~1B at ~40% MFU and ~40-45K tokens/s/GPU "
              "(llm-foundry MPT-1B 45,455 at 41.8%, OLMo-1B 44,000)")
    for r in rows:
        if "step_time_s" not in r:
            print(f"not measured: {r['size']} {r['variant']} compile={r['compile_mode']}: "
                  f"{r.get('error') or 'skipped, ' + r['skipped']}")
    missing = (expected - len(rows)) if expected is not None else 0
    if missing > 0:
        print(f"not measured: {missing} more (the run was stopped at its time limit)")
    return 0 if len(done) == (expected if expected is not None else len(rows)) else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu_matrix.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True, help="JSON lines file the results are appended to")
    m.add_argument("--sizes", nargs="+", required=True)
    m.add_argument("--variants", nargs="+", default=["standard", "review"])
    m.add_argument("--compile", nargs="+", default=["false", "true"], choices=["false", "true"])
    m.add_argument("--steps", type=int, default=8)
    m.add_argument("--warmup", type=int, default=2)
    m.add_argument("--budget-s", type=float, default=440.0, help="start no measurement expected to end past this")
    m.add_argument("--micro", action="append", default=[], metavar="SIZE=N", help="sequences per GPU for SIZE")
    m.add_argument("--default-micro", type=int, default=8, help="sequences per GPU for sizes not in the table")
    m.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="another config override for every measurement, e.g. --set parallel.ac=selective")
    r = sub.add_parser("render")
    r.add_argument("results")
    r.add_argument("--expect", type=int, default=None, help="measurements planned (missing ones are reported)")
    args = parser.parse_args(argv)
    if args.command == "render":
        return render(Path(args.results), args.expect)
    return measure(args)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # run as a script from anywhere: rrtrain is imported from this checkout
    code = main(sys.argv[1:])
    if "rrtrain.core.dist" in sys.modules:  # measured under torchrun: end as the trainer does (see exit_process)
        from rrtrain.core import dist

        dist.exit_process(code)
    sys.exit(code)


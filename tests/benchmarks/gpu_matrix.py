"""Many `rrtrain bench` measurements in one process, for `gpu.sh`: sizes x variants x compile modes, a float8 vs
bf16 pair, and one step of a large model at the setting `rrtrain plan` recommends.

    python tests/benchmarks/gpu_matrix.py measure --out R.jsonl --sizes rr-60m rr-1b \
        --variants standard standard@review review --compile true [--budget-s 435] [--steps 5 --warmup 2] \
        [--micro rr-1b=8] [--default-micro auto] [--set key=value ...] \
        [--float8-size rr-1b --float8 rowwise --loss-steps 60] [--big-size frontier-7b]
    python tests/benchmarks/gpu_matrix.py render R.jsonl [--expect N]

One process pays for Python, torch and CUDA start-up once; each measurement is `rrtrain.planning.bench.run_bench`, the
trainer's own step (rrtrain/training/step.py), on one fixed batch of random tokens, FSDP2, bf16 by default. Without
torchrun the process is a one-rank process group (FSDP2 needs one). torch.compile's caches are cleared between
measurements, so every compiled measurement compiles static shapes, as a training run does, and none reuses a
graph made for another shape. Each result is appended to R.jsonl as soon as it is measured (a failure or a
skip for want of time as a line too), so `render` can print the tables after a timeout.

A variant `A@B` is rule A parameter-matched to rule B (`match.reference=B`): `standard@review` is the paper's
baseline for `review`. A micro-batch `auto` is `train.micro_batch: auto`'s choice (rrtrain/parallel/auto_batch.py)
among the divisors of AUTO_PER_GPU sequences, measured without accumulation (global batch = the choice x ranks);
`shared` is the largest that `auto` chooses for every variant of the size, so that their step times compare.

The float8 pair (`--float8-size`): `standard` at that size in bf16 and with `parallel.float8`, the same seed and
the same `--loss-steps` batches of a seeded Markov chain (learnable, unlike uniform tokens), a fixed micro-batch;
tokens/s of each, and the mean loss over the last quarter of the steps, whose relative difference must stay
within `--loss-bound`. Without float8 hardware the float8 half is reported as unsupported, with the reason.

The large model (`--big-size`): `standard` at that size, with the AC mode and micro-batch `rrtrain plan` recommends
for one GPU of this kind (`rrtrain.parallel.memory.recommended`), its measured peak against the plan's (±20%).

Exit status of `measure`: 0, 1 when a measurement failed or was skipped, 3 when the process imported a
package the GPU machines lack (streaming, deepspeed, submitit).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from dataclasses import replace
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "train" / "tiny.yaml"
#: sequences of 1024 tokens per GPU per step without activation checkpointing: 12-32 GiB peak on an H200, so
#: they fit any 40 GB GPU; the larger batches that reach ~40% MFU at rr-1b are MICRO_<size> (docs/performance.md)
DEFAULT_MICRO = {"rr-60m": 16, "rr-150m": 16, "rr-320m": 16, "rr-590m": 8, "rr-1b": 8}
#: sizes in the tables' order
SIZE_ORDER = ("rr-60m", "rr-150m", "rr-320m", "rr-590m", "rr-1b", "frontier-7b")
#: not installed on the lent GPU machines: the bench path must not need them
ABSENT_ON_GPU = ("streaming", "deepspeed", "submitit")
#: `auto` chooses among the divisors of this many sequences per GPU (2^7 x 3: 8, 12, 16, 24, 32, 48, 64, 96, ...)
AUTO_PER_GPU = 384
#: the large model's micro-batches the plan chooses among
BIG_MICRO = (1, 2, 4, 8)
#: the plan's peak is checked against the measured one within this relative distance
PLAN_TOLERANCE = 0.20
#: review's time per token against its matched baseline's may exceed their FLOP ratio by this much
RATIO_SLACK = 0.05


#: the issue's step-time targets at rr-1b, compiled, as a multiple of `standard`'s ("flops+0.10": the rule's FLOP
#: ratio plus 10%)
TARGETS = {"mhc": "1.10", "hc_static": "1.10", "hc_dynamic": "1.10", "hc": "1.10", "attnres_block_4": "1.05",
           "gr": "flops+0.10"}


def slug(label: str) -> str:
    """bench_residuals.py's label as one shell word: 'hc (static)' -> 'hc_static'."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def variant_overrides(label: str) -> list[str]:
    """The config overrides of a variant: bench_residuals.py's VARIANTS by slug, else a rule name as it is."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_residuals import VARIANTS

    table = {slug(k): v for k, v in VARIANTS.items()}
    rule, residual = table.get(label, (label, {}))
    return [f"model.variant={rule}", *(f"model.residual.{k}={str(v).lower() if isinstance(v, bool) else v}"
                                       for k, v in residual.items())]


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

    table = DEFAULT_MICRO if args.default_micro == "table" else {}
    default = 8 if args.default_micro == "table" else args.default_micro
    micro = {**table, **dict(_size_value(m) for m in args.micro)}
    info = dist.setup(600)
    out = Path(args.out)
    versions = _versions()
    failed = 0
    spent: dict[str, float] = {}  # wall seconds of the last measurement per compile mode: what still fits
    shared: dict[str, tuple[int, int, list[int]]] = {}  # per size: `shared`'s micro-batch, free bytes, peaks

    def emit(row: dict[str, Any]) -> None:
        nonlocal failed
        failed += "skipped" in row or "error" in row
        if info.is_main:
            with out.open("a") as f:
                f.write(json.dumps({**row, **versions}, sort_keys=True) + "\n")
            print(f"gpu_matrix: {_title(row)}: " + _summary(row), file=sys.stderr, flush=True)

    def left() -> float:
        return args.budget_s - (time.monotonic() - start)

    try:
        if args.float8_size:
            for row in float8_pair(args, info, left):
                emit(row)
                _release(torch)
        if args.big_size:
            emit(big_step(args, info, left))
            _release(torch)
        for size, variant, compile_mode in plan(args.sizes, args.variants, args.compile):
            row: dict[str, Any] = {"kind": "matrix", "size": size, "variant": variant, "compile_mode": compile_mode}
            if left() < spent.get(compile_mode, 0.0):
                row["skipped"] = f"{left():.0f} s of the time budget left"
            else:
                t0 = time.monotonic()
                _attempt(row, lambda: _matrix_one(args, info, size, variant, compile_mode,
                                                  micro.get(size, default), shared))
                spent[compile_mode] = time.monotonic() - t0
                row["wall_s"] = round(spent[compile_mode], 1)
                _release(torch)
            emit(row)
    finally:
        dist.teardown()
    imported = sorted({m.split(".")[0] for m in sys.modules} & set(ABSENT_ON_GPU))
    if imported:
        print(f"gpu_matrix: error: the bench path imported {', '.join(imported)}, which the GPU machines lack",
              file=sys.stderr)
        return 3
    return 1 if failed else 0


def base_overrides(size: str, variant: str, compile_mode: str, micro_batch: Any, world: int) -> list[str]:
    """The bench settings of one measurement; `variant` A@B is A matched to B."""
    rule, _, reference = variant.partition("@")
    out = [f"model.size={size}", *variant_overrides(rule), "parallel.backend=fsdp", "parallel.precision=bf16",
           f"train.compile={compile_mode}"]
    if reference:
        out.append(f"match.reference={reference}")
    global_batch = AUTO_PER_GPU * world if micro_batch == "auto" else micro_batch * world
    return out + [f"train.micro_batch={micro_batch}", f"train.global_batch={global_batch}"]


def _attempt(row: dict[str, Any], work) -> None:
    """Run one measurement into `row`; a failure (e.g. CUDA out of memory) is recorded and the rest go on."""
    try:
        label = row.get("variant")
        row.update(work())
        row["rule"], row["variant"] = row.get("variant"), label  # the measurement's label (A@B) stays
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        traceback.print_exc()


def _matrix_one(args, info, size: str, variant: str, compile_mode: str, micro_batch: Any,
                shared: dict[str, tuple[int, int, list[int]]]) -> dict[str, Any]:
    from rrtrain.planning.bench import run_bench
    from rrtrain.resolve import load

    extra: dict[str, Any] = {}
    if micro_batch == "shared":  # one micro-batch for every variant of the size, chosen once
        if size not in shared:
            cfgs = [load(TINY, base_overrides(size, v, compile_mode, "auto", info.world_size) + args.overrides)
                    for v in args.variants]
            shared[size] = shared_micro(cfgs, info.world_size, info.device)
        micro_batch, free, peaks = shared[size]
        extra = {"auto": "shared", "planned_gb": peaks[args.variants.index(variant)] / 2**30, "free_gb": free / 2**30}
    cfg = load(TINY, base_overrides(size, variant, compile_mode, micro_batch, info.world_size) + args.overrides)
    if micro_batch == "auto":  # the choice, then measured without accumulation
        from rrtrain.parallel.auto_batch import resolve_micro_batch
        from rrtrain.resolve import resolve

        cfg, choice = resolve_micro_batch(resolve(cfg), info.world_size, info.device, announce=False)
        m = cfg.train.micro_batch
        cfg = replace(cfg, train=replace(cfg.train, global_batch=m * info.world_size))
        extra = {"auto": True, "planned_gb": choice.planned_bytes / 2**30, "free_gb": choice.free_bytes / 2**30}
    return {**run_bench(cfg, args.steps, args.warmup, info), **extra, "flops_ratio": _flops_ratio(cfg)}


def shared_micro(cfgs: list, world: int, device, free_bytes: Optional[int] = None) -> tuple[int, int, list[int]]:
    """The largest micro-batch `train.micro_batch: auto` chooses for every one of `cfgs` (each with micro_batch
    auto): the rules of a size measured at one batch, so their step times compare. Returns it, the free bytes it
    was sized against (`free_bytes`, else the device's) and each config's planned peak at it."""
    from rrtrain.parallel.auto_batch import free_memory, planned_peak, resolve_micro_batch
    from rrtrain.resolve import resolve

    runs = [resolve(c) for c in cfgs]
    free = free_memory(device) if free_bytes is None else free_bytes
    m = min(resolve_micro_batch(r, world, device, announce=False, free_bytes=free)[0].train.micro_batch for r in runs)
    return m, free, [planned_peak(r, world)(m) for r in runs]


def _flops_ratio(cfg) -> Optional[float]:
    """bench_residuals.py's predicted FLOP ratio to `standard` (render-rules' column); None where it cannot say."""
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_residuals import flops_ratio

        return float(flops_ratio(cfg.model))
    except Exception:  # a matched shape or a rule it does not know: the column is for gpu_rules.sh's rules
        return None


def markov_batches(vocab: int, seq_len: int, rows: int, seed: int, step: int, device) -> list:
    """One micro-batch of `rows` sequences (seq_len + 1 tokens) from a fixed first-order Markov chain over
    min(vocab, 4096) tokens with 4 successors each (entropy ln 4 per token): a model learns it within tens of
    steps, so two settings' losses can be compared. Step `step`'s batch is the same in every process."""
    import torch

    n = min(vocab, 4096)
    table = torch.randint(0, n, (n, 4), generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    picks = torch.randint(0, 4, (rows, seq_len + 1), generator=gen)
    tokens = torch.empty(rows, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, n, (rows,), generator=gen)
    for i in range(1, seq_len + 1):
        tokens[:, i] = table[tokens[:, i - 1], picks[:, i]]
    return [tokens.to(device)]


def float8_pair(args, info, left) -> list[dict[str, Any]]:
    """`standard` at --float8-size in bf16 and with parallel.float8=--float8, on the same Markov batches."""
    from rrtrain.parallel.float8 import hardware_problem
    from rrtrain.planning.bench import run_bench
    from rrtrain.resolve import load, resolve

    rows: list[dict[str, Any]] = []
    for setting in ("off", args.float8):
        # the time a half needs: the bf16 half's, a quarter more for float8's casts, once it ran; else a guess
        need = 1.25 * rows[0]["wall_s"] if rows and "step_time_s" in rows[0] else 60.0
        row: dict[str, Any] = {"kind": "float8", "size": args.float8_size, "variant": "standard", "float8": setting,
                               "compile_mode": args.float8_compile}
        problem = hardware_problem(info.device) if setting != "off" else None
        if problem is not None:
            row["unsupported"] = f"no float8 matmuls here: {problem}"
        elif left() < need:
            row["skipped"] = f"{left():.0f} s of the time budget left"
        else:
            overrides = (base_overrides(args.float8_size, "standard", args.float8_compile, args.float8_micro,
                                        info.world_size)
                         + args.overrides + [f"parallel.float8={setting}", f"train.lr={args.float8_lr}"])

            def work() -> dict[str, Any]:
                cfg = load(TINY, overrides)
                shape = resolve(cfg).shape
                data = lambda i: markov_batches(shape.vocab_size, shape.seq_len, args.float8_micro,  # noqa: E731
                                                cfg.train.seed + info.rank, i, info.device)
                warm = min(args.warmup, args.loss_steps - 1)
                return run_bench(cfg, args.loss_steps - warm, warm, info, batches_for_step=data)

            t0 = time.monotonic()
            _attempt(row, work)
            row["wall_s"] = round(time.monotonic() - t0, 1)
        rows.append(row)
    return rows


def _gpu_key(device) -> str:
    """The planner's name for this GPU (h200, h100, ...); h200 on a CPU or an unknown GPU."""
    import torch

    from rrtrain.core.hardware import GPU_MEMORY_GIB

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return next((k.lower() for k in GPU_MEMORY_GIB if k in name), "h200")


def big_step(args, info, left) -> dict[str, Any]:
    """`standard` at --big-size with the plan's recommended AC mode and micro-batch; measured vs planned peak."""
    from rrtrain.parallel import memory as planner
    from rrtrain.planning.bench import run_bench
    from rrtrain.resolve import load, resolve

    row: dict[str, Any] = {"kind": "big", "size": args.big_size, "variant": "standard",
                           "compile_mode": args.big_compile}
    if left() < 90:
        row["skipped"] = f"{left():.0f} s of the time budget left"
        return row

    def work() -> dict[str, Any]:
        cfg = load(TINY, base_overrides(args.big_size, "standard", args.big_compile, 1, info.world_size)
                   + args.overrides)
        run = resolve(cfg)
        gpu = _gpu_key(info.device)
        setup = planner.Setup(model=cfg.model, run=run, gpus=info.world_size, gpu=gpu, backend="fsdp",
                              precision="bf16", reshard_after_forward=cfg.parallel.reshard_after_forward)
        best = planner.recommended(planner.fitting(setup, BIG_MICRO))
        if best is None:  # an answer, not a failure: e.g. 7B's fp32 state alone outgrows an 80 GB H100
            return {"unsupported": f"rrtrain plan finds no setting of {args.big_size} that fits one {gpu.upper()} "
                                   f"(micro-batches {', '.join(map(str, BIG_MICRO))}, every AC mode)"}
        m, ac = best.setup.micro_batch, best.setup.ac
        cfg = replace(cfg, train=replace(cfg.train, micro_batch=m, global_batch=m * info.world_size),
                      parallel=replace(cfg.parallel, ac=ac))
        result = run_bench(cfg, args.big_steps, args.big_warmup, info)
        return {**result, "plan_gpu": gpu, "planned_gb": best.total() / 2**30}

    t0 = time.monotonic()
    _attempt(row, work)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def _versions() -> dict[str, str]:
    """torch's version, and torchao's as installed (read from its metadata: importing torchao costs seconds, and
    only the float8 pair needs it)."""
    import importlib.metadata

    import torch

    try:
        ao = importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        ao = "not installed"
    return {"torch": torch.__version__, "torchao": ao}


def _title(row: dict[str, Any]) -> str:
    kind = row.get("kind", "matrix")
    if kind == "float8":
        return f"float8 pair {row['size']} float8={row['float8']} compile={row['compile_mode']}"
    if kind == "big":
        return f"large model {row['size']} compile={row['compile_mode']}"
    return f"{row['size']} {row['variant']} compile={row['compile_mode']}"


def _size_value(text: str) -> tuple[str, Any]:
    size, _, value = text.partition("=")
    return size, _micro_value(value, f"--micro expects SIZE=N (N >= 1, auto or shared), got '{text}'")


def _micro_value(value: str, message: str = "") -> Any:
    """A micro-batch: a positive int, 'auto' or 'shared'."""
    if value in ("auto", "shared"):
        return value
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"gpu_matrix: error: {message or f'a micro-batch is N >= 1, auto or shared, got {value!r}'}")
    return int(value)


def _release(torch) -> None:
    """Free the measurement's graphs and memory so the next one starts clean (and compiles static shapes)."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _summary(row: dict[str, Any]) -> str:
    if "unsupported" in row:
        return f"not run ({row['unsupported']})"
    if "skipped" in row:
        return f"skipped ({row['skipped']})"
    if "error" in row:
        return f"FAILED ({row['error']})"
    return (f"{row['tokens_per_s']:,.0f} tokens/s, MFU {100 * row['mfu']:.1f}%, {row['peak_mem_gb']:.1f} GiB, "
            f"step {1000 * row['step_time_s']:.0f} ms ({row['wall_s']} s)")


def render(path: Path, expected: Optional[int], loss_bound: float = 0.02) -> int:
    """The tables: the size x variant matrix, review against standard and against its matched baseline, the float8
    pair, the large model against its plan; 1 when rows are missing or the float8 loss left its bound."""
    rows = _rows(path)
    matrix = [r for r in rows if r.get("kind", "matrix") == "matrix"]
    done = [r for r in matrix if "step_time_s" in r]
    order = {s: i for i, s in enumerate(SIZE_ORDER)}
    done.sort(key=lambda r: (order.get(r["size"], len(order)), r["size"], r["compile_mode"] != "false", r["variant"]))
    measured = [r for r in rows if "step_time_s" in r]
    if measured:
        r0 = measured[0]
        print(f"\nrrtrain bench: {r0['device']} x {r0['world_size']}, torch {r0.get('torch', '?')}, torchao "
              f"{r0.get('torchao', '?')}; FSDP2, {r0['precision']} (fp32 master weights and reductions)")
        print(f"MFU = tokens/s x FLOPs/token / peak; FLOPs/token = 6N + 12 x n_layers x seq_len x d_model (PaLM); "
              f"peak: {r0['peak_source']} = {r0['peak_flops'] / 1e12:.1f} TFLOP/s")
    ok = True
    if done:
        r0 = done[0]
        print(f"\nsizes: AC {r0['ac']}, {r0['steps']} timed steps after {r0['warmup']} warm-up; seqs/GPU 'auto': "
              f"train.micro_batch=auto's choice (plan GiB: the planner's peak for it)\n")
        print("| size | variant | params | compile | seqs/GPU x seq | tokens/s/GPU | MFU | peak GiB | plan GiB | step ms |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in done:
            seqs = f"{r['micro_batch']}{_auto_note(r)}"
            plan_gb = f"{r['planned_gb']:.1f}" if r.get("planned_gb") is not None else "—"
            print(f"| {r['size']} | {r['variant']} | {r['params'] / 1e6:.1f}M | {'yes' if r['compile'] else 'no'} | "
                  f"{seqs}x{r['shape']['seq_len']} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | "
                  f"{r['peak_mem_gb']:.1f} | {plan_gb} | {1000 * r['step_time_s']:.1f} |")
        by = {(r["size"], r["compile_mode"], r["variant"]): r for r in done}
        times = {k: r["step_time_s"] for k, r in by.items()}
        ratios = [(s, c, times[s, c, "review"] / times[s, c, "standard"]) for s, c, v in times
                  if v == "standard" and (s, c, "review") in times]
        if ratios:
            print("\n| size | compile | review / standard step time |\n|---|---|---|")
            for s, c, ratio in ratios:
                print(f"| {s} | {'yes' if c != 'false' else 'no'} | {ratio:.3f} |")
        render_matched(by)
        print("\npublished (H100 bf16): ~1B at ~40% MFU and ~40-45K tokens/s/GPU "
              "(llm-foundry MPT-1B 45,455 at 41.8%, OLMo-1B 44,000)")
    ok &= render_float8([r for r in rows if r.get("kind") == "float8"], loss_bound)
    render_big([r for r in rows if r.get("kind") == "big"])
    for r in rows:
        if "step_time_s" not in r and "unsupported" not in r:
            print(f"not measured: {_title(r)}: {r.get('error') or 'skipped, ' + r['skipped']}")
    missing = (expected - len(rows)) if expected is not None else 0
    if missing > 0:
        print(f"not measured: {missing} more (the run was stopped at its time limit)")
    counted = sum("step_time_s" in r or "unsupported" in r for r in rows)
    return 0 if ok and counted == (expected if expected is not None else len(rows)) else 1


def render_matched(by: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    """review against `standard@review` (its parameter-matched baseline) per (size, compile mode) where both were
    measured (`by`: rows by size, compile mode and variant): time per token beside the FLOP ratio and the target."""
    matched = [(s, c) for s, c, v in by if v == "standard@review" and (s, c, "review") in by]
    if not matched:
        return
    print(f"\nreview against standard matched to it (match.reference=review); time per token, since the two "
          f"may run different micro-batches at auto; target: at most the FLOP ratio + {RATIO_SLACK:.0%}\n")
    print("| size | compile | review / matched standard time per token | FLOP ratio | within target |")
    print("|---|---|---|---|---|")
    for s, c in matched:
        rev, std = by[s, c, "review"], by[s, c, "standard@review"]
        time_ratio = std["tokens_per_s"] / rev["tokens_per_s"]
        flop_ratio = rev["flops_per_token"] / std["flops_per_token"]
        within = "yes" if time_ratio <= flop_ratio + RATIO_SLACK else "NO"
        print(f"| {s} | {'yes' if c != 'false' else 'no'} | {time_ratio:.3f} | {flop_ratio:.3f} | {within} |")


def _auto_note(r: dict[str, Any]) -> str:
    """How a row's micro-batch was chosen, after its number: ' (auto)', ' (shared)' or nothing (fixed)."""
    return {True: " (auto)", "shared": " (shared)"}.get(r.get("auto"), "")


def loss_tail(r: dict[str, Any]) -> float:
    """Mean loss over the last quarter of a float8-pair run's steps."""
    losses = r["losses"]
    tail = losses[-max(1, len(losses) // 4):]
    return sum(tail) / len(tail)


def render_float8(rows: list[dict[str, Any]], bound: float) -> bool:
    """The float8 pair's table and verdict; False when the float8 loss left `bound` (relative) of bf16's."""
    if not rows:
        return True
    print("\nfloat8 against bf16 (standard, same seed, same Markov-chain batches; loss: mean of the last quarter of "
          "the steps)\n")
    print("| size | float8 | compile | seqs/GPU x seq | steps | tokens/s/GPU | MFU | peak GiB | loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "step_time_s" in r:
            print(f"| {r['size']} | {r['float8']} | {'yes' if r['compile'] else 'no'} | "
                  f"{r['micro_batch']}x{r['shape']['seq_len']} | {len(r['losses'])} | {r['tokens_per_s']:,.0f} | "
                  f"{100 * r['mfu']:.1f}% | {r['peak_mem_gb']:.1f} | {loss_tail(r):.4f} |")
    base = next((r for r in rows if r["float8"] == "off" and "step_time_s" in r), None)
    other = next((r for r in rows if r["float8"] != "off"), None)
    if other is not None and "unsupported" in other:
        print(f"float8 {other['float8']}: {other['unsupported']}")
    if base is None or other is None or "step_time_s" not in other:
        return True  # what is missing is reported as not measured
    speed = other["tokens_per_s"] / base["tokens_per_s"]
    diff = (loss_tail(other) - loss_tail(base)) / loss_tail(base)
    within = abs(diff) <= bound
    print(f"float8 {other['float8']} / bf16: tokens/s x{speed:.3f} (target >= 1.20); loss {diff:+.2%} "
          f"(bound {bound:.0%}): {'within' if within else 'OUTSIDE THE BOUND'}")
    return within


def render_big(rows: list[dict[str, Any]]) -> None:
    """The large model's step at the plan's recommendation: MFU, and measured against planned peak memory."""
    for r in rows:
        if "unsupported" in r:
            print(f"\n{r['size']} standard: not run: {r['unsupported']}")
        if "step_time_s" not in r:
            continue
        ratio = r["peak_mem_gb"] / r["planned_gb"]
        within = abs(ratio - 1.0) <= PLAN_TOLERANCE
        if r.get("peak_mem_kind") != "cuda max allocated":
            within = None  # a CPU's process RSS is no device peak: nothing to check
        print(f"\n{r['size']} standard ({r['params'] / 1e9:.2f}B params) on one {r['plan_gpu'].upper()} at rrtrain "
              f"plan's recommendation (AC {r['ac']}, {r['micro_batch']}x{r['shape']['seq_len']} tokens, compile "
              f"{'yes' if r['compile'] else 'no'}): {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.1f}%, "
              f"step {1000 * r['step_time_s']:.0f} ms")
        print(f"peak memory: measured {r['peak_mem_gb']:.1f} GiB, planned {r['planned_gb']:.1f} GiB (measured / "
              f"planned {ratio:.3f}; within ±{PLAN_TOLERANCE:.0%}: "
              f"{'n/a, ' + r['peak_mem_kind'] if within is None else 'yes' if within else 'NO'})")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def render_rules(path: Path, expected: Optional[int]) -> int:
    """Per size and compile mode, every rule against `standard`: step time, tokens/s, peak memory, and the
    predicted FLOP ratio beside the measured step-time ratio; 1 when rows are missing."""
    rows = [r for r in _rows(path) if r.get("kind", "matrix") == "matrix"]
    done = [r for r in rows if "step_time_s" in r]
    ref = {(r["size"], r["compile_mode"]): r for r in done if r["variant"] == "standard"}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in done:
        groups.setdefault((r["size"], r["compile_mode"]), []).append(r)
    order = {s: i for i, s in enumerate(SIZE_ORDER)}
    if done:
        r0 = done[0]
        print(f"\nthe rules' cost: {r0['device']} x {r0['world_size']}, FSDP2, {r0['precision']}, AC {r0['ac']}, "
              f"{r0['steps']} timed steps after {r0['warmup']} warm-up; step time is the median; x standard: the "
              f"same size and compile mode; FLOP ratio: 6N plus the rule's elementwise work, predicted")
    for (size, mode), group in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0])):
        base = ref.get((size, mode))
        g0 = group[0]
        print(f"\n### {size}, compile {'yes' if mode != 'false' else 'no'}: {g0['micro_batch']}{_auto_note(g0)} x "
              f"{g0['shape']['seq_len']} tokens per GPU per step\n")
        print("| rule | params | FLOP ratio | step ms | x standard | tokens/s/GPU | MFU | peak GiB | x standard | "
              "target |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in sorted(group, key=lambda r: (r["variant"] != "standard", r["variant"])):
            step = r.get("step_time_median_s", r["step_time_s"])
            ratio = mem = "—"
            if base is not None:
                ratio = f"{step / base.get('step_time_median_s', base['step_time_s']):.3f}"
                mem = f"{r['peak_mem_gb'] / base['peak_mem_gb']:.2f}" if base["peak_mem_gb"] else "—"
            flops = r.get("flops_ratio")
            target = TARGETS.get(r["variant"], "")
            if target == "flops+0.10":
                target = f"{flops + 0.10:.2f}" if flops is not None else "—"
            print(f"| {r['variant']} | {r['params'] / 1e6:.1f}M | {'—' if flops is None else format(flops, '.3f')} | "
                  f"{1000 * step:.1f} | "
                  f"{ratio} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | {r['peak_mem_gb']:.1f} | {mem} | "
                  f"{target} |")
    render_matched({(r["size"], r["compile_mode"], r["variant"]): r for r in done})
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
    m.add_argument("--sizes", nargs="*", default=[])
    m.add_argument("--variants", nargs="+", default=["standard", "review"])
    m.add_argument("--compile", nargs="+", default=["false", "true"], choices=["false", "true"])
    m.add_argument("--steps", type=int, default=8)
    m.add_argument("--warmup", type=int, default=2)
    m.add_argument("--budget-s", type=float, default=440.0, help="start no measurement expected to end past this")
    m.add_argument("--micro", action="append", default=[], metavar="SIZE=N",
                   help="sequences per GPU for SIZE (N, auto or shared)")
    m.add_argument("--default-micro", type=lambda v: v if v == "table" else _micro_value(v), default="table",
                   help="sequences per GPU for the sizes without --micro: N, auto (train.micro_batch=auto's choice), "
                        "shared (the largest auto chooses for every variant of the size) or table (default: "
                        "DEFAULT_MICRO's, else 8)")
    m.add_argument("--float8-size", default=None, help="measure the float8 vs bf16 pair at this size")
    m.add_argument("--float8", default="rowwise", choices=["rowwise", "tensorwise"], help="the recipe (rowwise)")
    m.add_argument("--float8-micro", type=int, default=16, help="the pair's sequences per GPU (16)")
    m.add_argument("--float8-compile", default="true", choices=["false", "true"])
    m.add_argument("--float8-lr", type=float, default=3e-4, help="the pair's learning rate (3e-4, no schedule)")
    m.add_argument("--loss-steps", type=int, default=60, help="the pair's optimizer steps, warm-up included (60)")
    m.add_argument("--big-size", default=None, help="one step of standard at this size, as rrtrain plan recommends")
    m.add_argument("--big-compile", default="true", choices=["false", "true"])
    m.add_argument("--big-steps", type=int, default=2)
    m.add_argument("--big-warmup", type=int, default=1)
    m.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="another config override for every measurement, e.g. --set parallel.ac=selective")
    for name in ("render", "render-rules"):
        r = sub.add_parser(name)
        r.add_argument("results")
        r.add_argument("--expect", type=int, default=None, help="measurements planned (missing ones are reported)")
        if name == "render":
            r.add_argument("--loss-bound", type=float, default=0.02, help="as measure's")
    args = parser.parse_args(argv)
    if args.command == "render":
        return render(Path(args.results), args.expect, args.loss_bound)
    if args.command == "render-rules":
        return render_rules(Path(args.results), args.expect)
    return measure(args)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # run as a script from anywhere: rrtrain is imported from this checkout
    code = main(sys.argv[1:])
    if "rrtrain.core.dist" in sys.modules:  # measured under torchrun: end as the trainer does (see exit_process)
        from rrtrain.core import dist

        dist.exit_process(code)
    sys.exit(code)


"""`rrtrain bench [CONFIG] [key=value ...] [--steps N] [--warmup N] [--json]`: throughput, MFU and memory.

A short training run of the configured model and backend on one fixed batch of random tokens (no dataset,
no run directory, no checkpoints): `--warmup` optimizer steps (compilation, allocator warm-up), then
`--steps` timed ones, each the trainer's own step (`rrtrain.training.step.optimizer_step`: accumulation x
forward/backward, the loss averaged over ranks, clipping, AdamW skipped on a non-finite step) at `train.lr`.
Distributed: `torchrun --nproc_per_node=N -m rrtrain bench CONFIG ...`; rank 0 reports per-device figures.

Reported (per device unless named otherwise):
  tokens/s   global_batch x seq_len / world size / mean step time
  MFU        tokens/s x FLOPs per token / peak FLOP/s. FLOPs per token = 6 x (matmul weights incl. the tied LM
             head and the residual rule's) + 12 x n_layers x seq_len x d_model (attention: PaLM's count), as in
             `rrtrain.sizing.flops_per_token`; the peak is the vendor's dense figure for the GPU and precision
             (`rrtrain.core.hardware`), or on CPU an fp32 matmul probe measured in this process; its source is printed.
  CPU time   median process CPU time per step (all threads; on a shared CPU less disturbed by other load
             than wall time)
  memory     peak allocated (CUDA) or the process's peak resident set (CPU), and the bytes of this rank's
             parameters and optimizer state (local shards under FSDP / ZeRO).
Vocabulary and sequence length: the dataset's when `data.path` is set, else the config's / preset's.
Default CONFIG: configs/train/tiny.yaml. Exit status: 0, or 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from rrtrain.config import Config
from rrtrain.core import dist
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain import sizing
from rrtrain.resolve import load, resolve
from rrtrain.training.step import grad_accumulation, optimizer_step, set_matmul_precision

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "train" / "tiny.yaml"


def parse_args(argv: list[str]) -> tuple[Optional[str], list[str], argparse.Namespace]:
    parser = CommandParser(prog="rrtrain bench", description=__doc__.split("\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("items", nargs="*", metavar="CONFIG | key=value",
                        help=f"a YAML config (default {DEFAULT_CONFIG.relative_to(DEFAULT_CONFIG.parents[2])}) "
                             "and overrides")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_intermixed_args(argv)
    config, overrides = None, []
    for item in args.items:
        if "=" in item:
            overrides.append(item)
        elif config is None:
            config = item
        else:
            raise UsageError(f"more than one config given ('{config}' and '{item}'); overrides are key=value")
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must not be negative, got {args.warmup}")
    return config, overrides, args


def local_state_bytes(engine) -> dict[str, int]:
    """Bytes of this rank's parameters and optimizer state: local shards under FSDP2 (DTensor) or ZeRO."""
    if hasattr(engine, "local_state_bytes"):
        return engine.local_state_bytes()

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    params = sum(local(p).numel() * local(p).element_size() for p in engine.model.parameters())
    optim = 0
    for state in engine.optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                optim += local(v).numel() * local(v).element_size()
    return {"param_bytes": int(params), "optim_bytes": int(optim)}


def random_batches(shape: sizing.ModelShape, micro_batch: int, accum: int, seed: int,
                   device: torch.device) -> list[torch.Tensor]:
    """One step's micro-batches of uniform random tokens (rows of seq_len + 1), on the device: the same batch
    every step, so no data loading is timed."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, shape.vocab_size, (micro_batch, shape.seq_len + 1), generator=gen).to(device)
            for _ in range(accum)]


def run_bench(cfg: Config, steps: int, warmup: int, info: Optional[dist.DistInfo] = None,
              batches_for_step: Optional[Callable[[int], list[torch.Tensor]]] = None) -> dict[str, Any]:
    """Build the configured model + engine, run warmup + timed optimizer steps on random tokens, measure.
    `batches_for_step(i)`: step i's micro-batches (on the device) instead of one fixed random batch, e.g. to
    compare the losses of two settings on the same data; made before each step's timer starts."""
    from rrtrain.core.hardware import peak_flops, peak_memory_gb
    from rrtrain.data.manifest import read_manifest
    from rrtrain.parallel import build_training_engine
    from rrtrain.parallel.float8 import require_hardware as require_float8
    from rrtrain.parallel.auto_batch import resolve_micro_batch

    info = info or dist.setup(cfg.parallel.timeout_s)
    require_float8(cfg.parallel.float8, info.device)
    run = resolve(cfg, read_manifest(cfg.data.path) if cfg.data.path is not None else None)
    cfg, auto = resolve_micro_batch(run, info.world_size, info.device, announce=info.is_main)  # "auto" -> an int
    run = replace(run, cfg=cfg)
    t = cfg.train
    shape = run.shape
    accum = grad_accumulation(t, info.world_size)
    set_matmul_precision(cfg.parallel.precision)
    device = info.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    from rrtrain.parallel.compile_policy import resolve_compile

    compiled = resolve_compile(t.compile, device, warmup + steps, announce=info.is_main)
    cfg = replace(cfg, train=replace(t, compile=compiled))
    torch.manual_seed(t.seed)
    engine = build_training_engine(cfg, shape, info, rule=run.rule)  # training's own build: meta, shard, materialise
    peak, peak_source = peak_flops(device, cfg.parallel.precision)  # the CPU probe runs here, before timing
    fpt = run.flops_per_token
    batches = random_batches(shape, t.micro_batch, accum, t.seed + info.rank, device)

    losses, times, cpu_times = [], [], []
    for i in range(warmup + steps):
        if batches_for_step is not None:
            batches = batches_for_step(i)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = optimizer_step(engine, iter(batches), accum, t.lr, t.grad_clip, info).loss  # training's own step
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
        losses.append(loss)
    mean = sum(times) / len(times)
    tokens_per_device = t.global_batch * shape.seq_len / info.world_size
    tps = tokens_per_device / mean
    result: dict[str, Any] = {
        "variant": cfg.model.variant, "size": cfg.model.size, "shape": asdict(shape),
        "params": run.params,
        "backend": cfg.parallel.backend, "zero_stage": cfg.parallel.zero_stage if cfg.parallel.backend == "deepspeed"
        else None, "precision": cfg.parallel.precision, "compile": compiled, "ac": cfg.parallel.ac,
        "world_size": info.world_size, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "micro_batch": t.micro_batch, "global_batch": t.global_batch,
        "accum": accum, "warmup": warmup, "steps": steps,
        "step_time_s": mean, "step_time_median_s": statistics.median(times), "step_time_min_s": min(times),
        "step_cpu_time_s": statistics.median(cpu_times),
        "tokens_per_s": tps, "tokens_per_s_total": tps * info.world_size,
        "flops_per_token": fpt, "tflops_per_s": fpt * tps / 1e12,
        "peak_flops": peak, "peak_source": peak_source, "mfu": fpt * tps / peak,
        "peak_mem_gb": peak_memory_gb(device),
        "peak_mem_kind": "cuda max allocated" if device.type == "cuda" else "process max RSS",
        "loss_first": float(losses[0]), "loss_last": float(losses[-1]),
        "float8": cfg.parallel.float8,
        "auto_micro_batch": asdict(auto) if auto is not None else None,
    }
    if batches_for_step is not None:
        result["losses"] = [float(x) for x in losses]
    result.update(local_state_bytes(engine))
    return result


def render(r: dict[str, Any]) -> str:
    s = r["shape"]
    zero = f" ZeRO-{r['zero_stage']}" if r["zero_stage"] else ""
    return "\n".join([
        f"rrtrain bench: {r['variant']} {r['size']} ({r['params']:,} params; d_model {s['d_model']}, "
        f"{s['n_layers']} blocks, seq {s['seq_len']}, vocab {s['vocab_size']})",
        f"  {r['backend']}{zero}, {r['precision']}, compile {'on' if r['compile'] else 'off'}, AC {r['ac']}, "
        f"world {r['world_size']} x {r['device']} ({r['threads']} threads)",
        f"  batch       {r['micro_batch']} seqs x accum {r['accum']} x world {r['world_size']} "
        f"= {r['global_batch']} seqs/step",
        f"  step time   {r['step_time_s']:.4f} s mean of {r['steps']} (median {r['step_time_median_s']:.4f}, "
        f"min {r['step_time_min_s']:.4f}; {r['warmup']} warm-up steps)",
        f"  tokens/s    {r['tokens_per_s']:,.0f} per device ({r['tokens_per_s_total']:,.0f} total)",
        f"  MFU         {100 * r['mfu']:.2f}% = {r['tflops_per_s']:.3g} TFLOP/s of {r['peak_flops'] / 1e12:.3g} "
        f"(peak: {r['peak_source']}; {r['flops_per_token']:.4g} FLOPs/token = 6N + 12LTD, PaLM's count)",
        f"  memory      {r['peak_mem_gb']:.2f} GB peak ({r['peak_mem_kind']}); this rank holds "
        f"{r['param_bytes'] / 2**20:.1f} MiB parameters + {r['optim_bytes'] / 2**20:.1f} MiB optimizer state",
        f"  loss        {r['loss_first']:.4f} -> {r['loss_last']:.4f}",
    ])


def main(argv: list[str]) -> int:
    config, overrides, args = parse_args(argv)
    cfg = load(config or DEFAULT_CONFIG, overrides)
    info = dist.setup(cfg.parallel.timeout_s)
    try:
        result = run_bench(cfg, args.steps, args.warmup, info)
        if info.is_main:
            print(json.dumps(result, sort_keys=True) if args.json else render(result), flush=True)
        dist.barrier()
    finally:
        dist.teardown()
    return 0

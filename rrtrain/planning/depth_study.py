"""The depth study: does each residual rule train at a deep shape, at three learning rates? One command.

    python -m rrtrain.planning.depth_study run --out R.jsonl [--shapes rr-590m rr-1b]
        [--rules review_convex review highway_convex highway] [--lr-factors 0.3333333 1 3] [--steps 100]
        [--budget-s 270] [--set key=value ...]
    python -m rrtrain.planning.depth_study render R.jsonl [--expect N]

For each (shape, rule, lr) it trains on the built-in synthetic stories with a BPE vocabulary
(rrtrain/planning/depth_data.py: `rrtrain prep`'s corpus, tokenizer and packing, in memory), with the convergence
monitor (`LossMonitor`, as a run's `MonitorCallback` feeds it) stopping the run when it stalls or diverges, and
reports a verdict (rrtrain/planning/depth_verdict.py): trained / stalled at step N / diverged / undecided, the
final loss against the data's unigram entropy, and the per-block gradient norms at initialisation and at the end
(the trainer's `block_grad_norm` diagnostic: `Engine.grad_sq_norms` over each block's parameters, the measure of
docs/depth.md). Every step is training's own (`rrtrain.training.step.optimizer_step` on the engine
`build_training_engine` builds, `parallel.backend=none`, warmup-cosine `lr_at`); the optimizer settings are
configs/train/paper.yaml's unless `--config` names another, and its `train.lr` is the default the factors scale.

The model of a (shape, rule) is built once (meta, then materialised from `train.seed`, as training does); each
learning rate starts from a copy of those initial weights and a fresh AdamW state, so the runs of one (shape,
rule) differ by their learning rate alone, and a run is a function of its settings and seed. Every run of a
shape reads the same batches in the same order.

Time: `--budget-s` bounds the whole study (data, builds and runs). Each run may spend the time left divided by
the runs left; a run that reaches its share stops there and is marked `time_capped` (its verdict is on the steps
it made); a run with under 2 s left is skipped and listed. A run stopped by the monitor leaves its time to the
runs after it. Results are rewritten (atomically) after every run, so a study stopped from outside keeps what
it measured. Needs torch, numpy, pyyaml and `tokenizers`, not mosaicml-streaming: it runs on a machine that
has only those (tests/benchmarks/gpu_rules.sh). Exit status 0, 1 when a run failed or was skipped, 2 for bad
input.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

from rrtrain.core import files
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "configs" / "train" / "paper.yaml"
RULES = ("review_convex", "review", "highway_convex", "highway")
MIN_RUN_S = 2.0  # a run with less time than this left is skipped


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser(prog="python -m rrtrain.planning.depth_study", description=__doc__.split("\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train every (shape, rule, lr) and write the results")
    r.add_argument("--out", required=True, help="JSON lines file of the results (one line per run)")
    r.add_argument("--shapes", nargs="+", default=["rr-590m", "rr-1b"], help="size presets (configs/sizes/)")
    r.add_argument("--rules", nargs="+", default=list(RULES))
    r.add_argument("--lr-factors", nargs="+", type=float, default=[1 / 3, 1.0, 3.0],
                   help="multiples of the default learning rate (the config's train.lr)")
    r.add_argument("--config", default=str(PAPER), help="the optimizer's settings (default configs/train/paper.yaml)")
    r.add_argument("--steps", type=int, default=100, help="optimizer steps per run (default 100)")
    r.add_argument("--warmup", type=int, default=None, help="warmup steps (default: a tenth of --steps)")
    r.add_argument("--micro-batch", type=int, default=16, help="sequences per step (default 16)")
    r.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    r.add_argument("--tokenizer", default="bpe:4096", help="bpe:N (trained on the corpus) or byte (default bpe:4096)")
    r.add_argument("--docs", type=int, default=8000, help="synthetic stories to prepare (default 8000)")
    r.add_argument("--val-rows", type=int, default=32, help="rows held out for the final validation loss")
    r.add_argument("--precision", default="bf16", choices=["fp32", "fp32_tf32", "bf16"])
    r.add_argument("--window", type=int, default=None, help="monitor.window (default: a quarter of --steps)")
    r.add_argument("--min-steps", type=int, default=None, help="monitor.min_steps (default: half of --steps)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--budget-s", type=float, default=None, help="seconds for the whole study (default: no limit)")
    r.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="another config override for every run, e.g. --set model.n_layers=10")
    d = sub.add_parser("render", help="print the table of a results file")
    d.add_argument("results")
    d.add_argument("--expect", type=int, default=None, help="runs planned (missing ones are reported)")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.steps < 2 or args.micro_batch < 1 or not args.lr_factors or min(args.lr_factors) <= 0:
            raise UsageError("--steps must be at least 2, --micro-batch at least 1 and every --lr-factors positive")
        args.warmup = max(1, args.steps // 10) if args.warmup is None else args.warmup
        args.window = max(4, args.steps // 4) if args.window is None else args.window
        args.min_steps = args.steps // 2 if args.min_steps is None else args.min_steps
        if not 0 <= args.warmup < args.steps or args.window < 2:
            raise UsageError(f"--warmup must be in [0, --steps) and --window at least 2 "
                             f"(got {args.warmup} and {args.window})")
    return args


def plan(shapes: list[str], rules: list[str], factors: list[float]) -> list[tuple[str, str, float]]:
    """Shape by shape, rule by rule (one model build each), the default learning rate first."""
    ordered = sorted(factors, key=lambda f: (abs(math.log(f)), f))
    return [(s, r, f) for s in shapes for r in rules for f in ordered]


def config_for(args: argparse.Namespace, shape: str, rule: str):  # noqa: ANN201 - a Config
    from rrtrain.resolve import load

    return load(args.config, [
        f"model.size={shape}", f"model.variant={rule}", f"model.seq_len={args.seq_len}", "match.reference=null",
        "parallel.backend=none", f"parallel.precision={args.precision}", "parallel.ac=none", "train.compile=false",
        f"train.micro_batch={args.micro_batch}", f"train.global_batch={args.micro_batch}",
        f"train.max_steps={args.steps}", f"train.warmup_steps={args.warmup}", f"train.seed={args.seed}",
        *args.overrides])


class Batches:
    """Every run of a study reads the same rows in the same order: seeded permutations, epoch after epoch."""

    def __init__(self, rows, micro_batch: int, seed: int) -> None:  # noqa: ANN001 - a tensor on the device
        import torch

        self.rows, self.micro, self.gen = rows, micro_batch, torch.Generator().manual_seed(seed)
        self.order = torch.zeros(0, dtype=torch.long)

    def batch(self, step: int):  # noqa: ANN201 - a tensor
        import torch

        end = (step + 1) * self.micro
        while len(self.order) < end:
            self.order = torch.cat([self.order, torch.randperm(len(self.rows), generator=self.gen)])
        return self.rows[self.order[step * self.micro:end].to(self.rows.device)]


def held_out_loss(engine, val, micro: int) -> Optional[float]:  # noqa: ANN001
    import torch

    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(val), micro):
            b = val[i:i + micro]
            total += float(engine.forward(b[:, :-1], b[:, 1:]).float()) * len(b)
            n += len(b)
    return total / n if n and math.isfinite(total) else None


def restore(engine, initial) -> None:  # noqa: ANN001
    """The weights as built and a fresh AdamW state: each learning rate starts from the same point."""
    import torch

    with torch.no_grad():
        for p, p0 in zip(engine.model.parameters(), initial):
            p.copy_(p0)
    engine.optimizer.zero_grad(set_to_none=True)
    engine.optimizer.state.clear()  # AdamW's moments and step counts are created again at the next step


def train_one(engine, cfg, batches: Batches, val, lr: float, steps: int, mon, entropy: float,  # noqa: ANN001
              info, deadline: float) -> dict[str, Any]:
    """One run from the built weights: returns its losses, flags, verdict inputs and gradient profiles."""
    from rrtrain.monitoring.convergence import DIVERGED, STALLED, LossMonitor
    from rrtrain.training.optim import lr_at
    from rrtrain.training.step import block_grad_norms, gradient_only, optimizer_step

    t = cfg.train
    monitor = LossMonitor(mon, entropy, start_step=t.warmup_steps)
    losses: list[float] = []
    times: list[float] = []
    init_norms: list[float] = []
    nonfinite_run, nonfinite_stop, capped = 0, None, False
    for step in range(steps):
        t0 = time.monotonic()
        before = (lambda: init_norms.extend(block_grad_norms(engine))) if step == 0 else None
        out = optimizer_step(engine, iter([batches.batch(step)]), 1, lr_at(step, steps, lr, t.warmup_steps,
                             t.min_lr_ratio), t.grad_clip, info, before_clip=before)
        loss, skipped = float(out.loss), bool(out.nonfinite.item())  # one host sync per step: the monitor's
        times.append(time.monotonic() - t0)
        losses.append(loss)
        nonfinite_run = nonfinite_run + 1 if skipped else 0
        record = {"step": step + 1, "loss": loss, "skipped": skipped}
        flags = monitor.update({**record, "block_grad_norm": init_norms} if step == 0 else record)  # a diag step
        if nonfinite_run >= t.max_nonfinite:
            nonfinite_stop = step + 1
            break
        if any(f.name in (STALLED, DIVERGED) for f in flags):
            break
        if step + 1 < steps and time.monotonic() > deadline:
            capped = True
            break
    return {"losses": losses, "flags": dict(monitor.raised), "nonfinite_stop": nonfinite_stop, "time_capped": capped,
            "steps_done": len(losses), "step_ms": 1000 * statistics.median(times),
            "block_grad_norm_init": init_norms, "block_grad_norm": gradient_only(engine, batches.batch(len(losses))),
            "val_loss": held_out_loss(engine, val, t.micro_batch)}


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    budget = args.budget_s if args.budget_s is not None else math.inf
    import torch

    from rrtrain.config import MonitorConfig
    from rrtrain.core import dist
    from rrtrain.core.io import atomic_write_text, unwritable_reason
    from rrtrain.parallel import build_training_engine
    from rrtrain.planning.depth_data import story_rows
    from rrtrain.planning.depth_verdict import render, verdict
    from rrtrain.resolve import resolve
    from rrtrain.training.step import set_matmul_precision

    for s in args.shapes:  # bad input before any work
        for r in args.rules:
            config_for(args, s, r)
    out = Path(args.out)
    problem = unwritable_reason(out.parent) if not out.is_dir() else "it is a directory"
    if problem:
        raise UsageError(f"--out '{out}' cannot be written: {problem}")
    info = dist.setup(600)
    data = story_rows(args.docs, args.tokenizer, args.seq_len, args.val_rows, args.seed)
    print(f"depth study: {data.documents} stories, {data.tokenizer}, {len(data.train)} rows of {data.seq_len + 1} "
          f"tokens, unigram entropy {data.unigram_entropy:.4f} nats ({time.monotonic() - start:.1f} s)",
          file=sys.stderr, flush=True)
    rows_t = torch.from_numpy(data.train).to(info.device)
    val_t = torch.from_numpy(data.val).to(info.device)
    mon = MonitorConfig(min_steps=args.min_steps, window=args.window)
    set_matmul_precision(args.precision)
    todo = plan(args.shapes, args.rules, args.lr_factors)
    results: list[dict[str, Any]] = []
    engine, built, failed = None, None, 0
    for i, (shape_name, rule, factor) in enumerate(todo):
        cfg = config_for(args, shape_name, rule)
        resolved = resolve(cfg, data.manifest())
        lr = cfg.train.lr * factor
        row: dict[str, Any] = {"shape_name": shape_name, "rule": rule, "lr": lr, "lr_factor": factor,
                               "seed": args.seed, "steps": args.steps, "sublayers": resolved.shape.n_sublayers,
                               "shape": dataclasses.asdict(resolved.shape),
                               "params": resolved.params, "tokenizer": data.tokenizer,
                               "unigram_entropy": data.unigram_entropy, "precision": args.precision,
                               "micro_batch": args.micro_batch, "seq_len": data.seq_len, "warmup": args.warmup,
                               "monitor": {"window": mon.window, "min_steps": mon.min_steps,
                                           "min_improvement": mon.min_improvement,
                                           "entropy_margin": mon.entropy_margin},
                               "device": torch.cuda.get_device_name(info.device) if info.device.type == "cuda"
                               else "cpu"}
        t0 = time.monotonic()
        try:
            if built != (shape_name, rule):
                engine = initial = None
                _release(torch)
                b0 = time.monotonic()
                torch.manual_seed(cfg.train.seed)
                engine = build_training_engine(cfg, resolved.shape, info, rule=resolved.rule)
                initial = [p.detach().clone() for p in engine.model.parameters()]
                built = (shape_name, rule)
                row["build_s"] = round(time.monotonic() - b0, 2)
            left = budget - (time.monotonic() - start)
            share = left / (len(todo) - i)
            if share < MIN_RUN_S:
                row["skipped"] = f"{left:.0f} s of the time budget left"
            else:
                restore(engine, initial)
                got = train_one(engine, cfg, Batches(rows_t, args.micro_batch, args.seed), val_t, lr, args.steps,
                                mon, data.unigram_entropy, info, time.monotonic() + share)
                row.update(got)
                row.update(verdict(got["losses"], got["flags"], data.unigram_entropy, mon.entropy_margin,
                                   got["nonfinite_stop"]))
        except Exception as err:  # e.g. out of memory: report it and go on
            import traceback

            traceback.print_exc()
            row["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            engine, built = None, None
        row["wall_s"] = round(time.monotonic() - t0, 2)
        failed += "verdict" not in row
        results.append(row)
        atomic_write_text(out, "".join(json.dumps(r, sort_keys=True) + "\n" for r in results))
        print(f"depth study: {shape_name} {rule} lr={lr:.3g}: " + _summary(row), file=sys.stderr, flush=True)
    print(render(results), flush=True)
    return 1 if failed else 0


def _release(torch) -> None:  # noqa: ANN001 - the torch module
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _summary(row: dict[str, Any]) -> str:
    if "verdict" not in row:
        return f"not run ({row.get('error') or row.get('skipped')})"
    at = f" at step {row['at_step']}" if row.get("at_step") is not None else ""
    final = row["final_loss"]
    return (f"{row['verdict']}{at}, {row['steps_done']} steps, final loss "
            f"{'—' if final is None else format(final, '.4f')} (entropy {row['unigram_entropy']:.4f}), "
            f"{row['step_ms']:.0f} ms/step, {row['wall_s']} s")


def render_file(path: Path, expected: Optional[int]) -> int:
    """Print the table of a results file; 1 when runs are missing, failed or were skipped."""
    from rrtrain.planning.depth_verdict import render

    rows = []
    if path.exists():
        with files.open_regular(path) as fh:  # not a link, not a FIFO; an overlong line is left out
            rows = [json.loads(line) for line in files.lines(fh) if line is not None and line.strip()]
    print(render(rows))
    missing = (expected - len(rows)) if expected is not None else 0
    if missing > 0:
        print(f"not run: {missing} more (the study was stopped at its time limit)")
    done = sum("verdict" in r for r in rows)
    return 0 if done == (expected if expected is not None else len(rows)) else 1


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "render":
        return render_file(Path(args.results), args.expect)
    return run(args)


if __name__ == "__main__":
    from rrtrain.core.command import run_command

    sys.exit(run_command("depth_study", main, sys.argv[1:]))

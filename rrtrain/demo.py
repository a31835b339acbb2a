"""`rrtrain demo`: the embedded default, end to end on this machine's CPU.

1. prep    the built-in synthetic children's stories -> byte-level MDS shards
2. train   review, highway and standard (the baselines parameter-matched to review by widening the MLP),
           at the `tiny` preset, several seeds each, one process per run
3. report  the Welch-t table, scaling and curve plots

Every step is a real run of the same commands a user types; nothing is simulated. Re-running skips runs
that already finished (their final.json says completed) and resumes unfinished ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rrtrain.errors import UsageError
from rrtrain.sizing import configs_dir


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def parse(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="rrtrain demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--variants", default="review,highway,standard")
    p.add_argument("--seeds", type=int, default=2, help="seeds per variant (default 2)")
    p.add_argument("--steps", type=int, default=150, help="optimizer steps per run (default 150)")
    p.add_argument("--num-docs", type=int, default=3000, help="synthetic stories to generate (default 3000)")
    p.add_argument("--executor", choices=["local"], default="local",
                   help="local: one process per run, in sequence (Slurm executors come with the launchers)")
    return p.parse_args(argv)


def _run(cmd: list[str], what: str) -> None:
    print(f"\n$ {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise SystemExit(f"rrtrain demo: {what} failed with exit status {proc.returncode}")


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.seeds < 1 or args.steps < 1 or args.num_docs < 10:
        raise UsageError("--seeds and --steps must be at least 1, --num-docs at least 10")
    out = Path(args.out)
    data, runs, report = out / "data", out / "runs", out / "report"
    py = sys.executable
    t0 = time.time()
    if not (data / "manifest.json").exists():
        _run([py, "-m", "rrtrain", "prep", "--source", "synthetic:stories", "--tokenizer", "byte",
              "--seq-len", "128", "--num-docs", str(args.num_docs), "--out", str(data)], "data prep")
    else:
        print(f"data: {data} already prepared, reusing it")
    variants = [v for v in args.variants.split(",") if v]
    done = []
    for variant in variants:
        for seed in range(args.seeds):
            run_dir = runs / f"{variant}-s{seed}"
            final = run_dir / "final.json"
            if final.exists() and json.loads(final.read_text()).get("status") == "completed":
                print(f"{run_dir}: already completed, skipping")
            else:
                _run([py, "-m", "rrtrain", "train", str(configs_dir() / "train" / "tiny.yaml"),
                      f"data.path={data}", f"run.dir={run_dir}", f"model.variant={variant}", f"train.seed={seed}",
                      f"train.max_steps={args.steps}", "match.reference=review", "train.eval_every=50",
                      "train.ckpt_every=50", "train.log_every=10"], f"training {variant} seed {seed}")
            done.append(json.loads(final.read_text()))
    _run([py, "-m", "rrtrain", "report", str(runs), "--out", str(report)], "report")
    print(f"\nrrtrain demo: done in {time.time() - t0:.0f} s. What it did:")
    print(f"  prepared   {data} (synthetic stories, byte-level, seq_len 128)")
    for fin in done:
        print(f"  trained    {fin['variant']:<10} seed {fin['seed']}  {fin['params']:>9,} params  "
              f"{fin['step']} steps  val loss {fin['final_val_loss']:.4f}  [{fin['status']}]")
    print(f"  reported   {report}/report.md and its plots")
    return 0

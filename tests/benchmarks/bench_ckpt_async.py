"""What a checkpoint costs the training loop, written in the foreground (A) and in the background (B,
`train.ckpt_async=true`), for a ~20M-parameter model in one CPU process.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_ckpt_async.py   (or `make bench`)

Each run trains 15 steps with a checkpoint every 3 (steps 3, 6, 9, 12; the end's at 15 is synchronous in both
modes and left out). The figures come from the run's own `"kind": "checkpoint"` records in metrics.jsonl:
`blocking_s` is the time the loop spent in the save (A: all of it; B: starting it, i.e. the RNG files and the
copy of the state into CPU memory, plus publishing it), `write_s` the time from its start until its files
were written and hashed. The step time of the two steps after each checkpoint (from the records' tokens/s,
which exclude the checkpoint itself) shows what the background write takes from training on a machine with
few cores. A and B alternate, three times each; medians.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from trainutil import final, records, train

MODEL = ["model.d_model=384", "model.n_layers=8", "model.n_heads=6", "model.d_ff=1536", "model.vocab_size=8192"]
RUN = ["train.max_steps=15", "train.ckpt_every=3", "train.log_every=1", "train.eval_every=0",
       "train.global_batch=4", "train.micro_batch=4", "train.keep_ckpts=2", "data.eval_batches=1"]
PERIODIC = (3, 6, 9, 12)


def one_run(run_dir: Path, data: Path, background: bool) -> dict[str, float]:
    train(run_dir, data, *MODEL, *RUN, f"train.ckpt_async={'true' if background else 'false'}", timeout=1200)
    recs = records(run_dir)
    ckpts = {r["step"]: r for r in recs if r.get("kind") == "checkpoint"}
    steps = {r["step"]: r for r in recs if "loss" in r}
    tokens = 4 * 64
    after = [tokens / steps[s + k]["tokens_per_s"] for s in PERIODIC for k in (1, 2)]
    others = [tokens / r["tokens_per_s"] for s, r in steps.items()
              if s > 1 and not any(0 < s - c <= 2 for c in PERIODIC)]
    return {"blocking_s": statistics.median(ckpts[s]["blocking_s"] for s in PERIODIC),
            "write_s": statistics.median(ckpts[s]["write_s"] for s in PERIODIC),
            "lag_steps": statistics.median(ckpts[s]["published_at"] - s for s in PERIODIC),
            "step_after_s": statistics.median(after), "step_other_s": statistics.median(others),
            "wall_s": final(run_dir)["wall_s"], "params": final(run_dir)["params"]}


def test_checkpoint_blocking_time_sync_vs_async(tmp_path, stories_data):
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for i in range(3):
        for background in (False, True):
            runs[background].append(one_run(tmp_path / f"run-{background}-{i}", stories_data, background))
    med = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()}
    print(f"\ncheckpoint cost, {med[False]['params'] / 1e6:.2f}M params, medians of 3 runs x 4 checkpoints")
    print("| mode | loop blocked per checkpoint s | write s | published after (steps) | step s after a checkpoint "
          "| step s otherwise | run wall s |")
    print("|---|---|---|---|---|---|---|")
    for background, name in ((False, "sync"), (True, "async")):
        m = med[background]
        print(f"| {name} | {m['blocking_s']:.3f} | {m['write_s']:.3f} | {m['lag_steps']:.0f} | {m['step_after_s']:.3f} "
              f"| {m['step_other_s']:.3f} | {m['wall_s']:.1f} |")
    print(f"blocking ratio async/sync: {med[True]['blocking_s'] / med[False]['blocking_s']:.2f}")
    assert med[True]["blocking_s"] < 0.5 * med[False]["blocking_s"]

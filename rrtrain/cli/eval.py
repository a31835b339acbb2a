"""`rrtrain eval RUN_DIR [--step N] --tasks T1,T2 [--limit K] [--num-fewshot F] [--batch-size B] [--include PATH]`:
downstream tasks of lm-evaluation-harness on one checkpoint of a run (`pip install 'rrtrain[eval]'`).

Tasks come from lm-eval's registry (their data from the Hugging Face cache or hub, as lm-eval fetches it) or
from task YAML files of your own (`--include`: a directory or one file; lm-eval's `include_path`): multiple-choice,
log-likelihood and perplexity tasks, and generation tasks (`generate_until`, decoded greedily with a key/value
cache, as `lm_eval --model hf` decodes an export; rrtrain/eval/generate.py). Prints a
table (task, metric, value, stderr) and writes `RUN_DIR/eval/step_NNNNNNNN-KEY.json` (written aside and
renamed; docs/evaluation.md), or the same file in `--out DIR`: a run directory someone else can write (or owns)
is read, never written into, so its result goes elsewhere. Bad input (an unknown task, a step without a
checkpoint, a directory that is not a run, a tokenizer that does not match the checkpoint, a generation task that
samples or leaves no room for its context, a result directory someone else can write) is one line, exit status 2,
and nothing is written.

`--data DIR` names a prepared dataset: the model's tokenizer is read from its manifest (where the run's own dataset
has moved, or another dataset prepared with the same tokenizer; a mixture run without it uses its first source),
and the mean loss over DIR's validation split is printed (`--tasks` may then be left out).

On several GPUs, launch it with torchrun (`python -m launchers.torchrun.local --nproc_per_node=N -m rrtrain eval
...`): each rank loads the model on its own device, scores (or generates) every N-th batch of the requests, and the results
are gathered, as in-loop evaluation does; rank 0 prints the table and writes the file.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError


def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (config.yaml, metrics.jsonl, checkpoints/)")
    p.add_argument("--tasks", default=None, help="comma-separated lm-eval task names (needed unless --data is given)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="a prepared dataset: its tokenizer is used, and the loss on its validation split is printed")
    p.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    p.add_argument("--limit", type=int, default=None, metavar="K", help="the first K documents of each task")
    p.add_argument("--num-fewshot", type=int, default=None, metavar="F",
                   help="few-shot examples per prompt (default: each task's own, else 0)")
    p.add_argument("--batch-size", type=int, default=16, metavar="B", help="sequences per forward (default 16)")
    p.add_argument("--include", default=None, metavar="PATH", help="a directory or YAML file of your own tasks")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write the result file here instead of RUN_DIR/eval (needed for a run directory someone "
                   "else can write)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when there is one)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the model's dtype (default fp32)")
    p.add_argument("--bootstrap-iters", type=int, default=1000, metavar="N",
                   help="resamples for the bootstrapped standard errors (perplexities...); 0: none (default 1000)")
    return p.parse_args(argv)


def check(args: argparse.Namespace) -> None:
    for flag, value, least in (("--limit", args.limit, 1), ("--num-fewshot", args.num_fewshot, 0),
                               ("--batch-size", args.batch_size, 1), ("--bootstrap-iters", args.bootstrap_iters, 0),
                               ("--step", args.step, 0)):
        if value is not None and value < least:
            raise UsageError(f"{flag} must be at least {least}, got {value}")
    if args.tasks is None and args.data is None:
        raise UsageError("--tasks is needed (or --data DIR for the loss on a prepared dataset's validation split)")


def main(argv: list[str]) -> int:
    args = parse(argv)
    check(args)
    if args.data is not None:
        from rrtrain.data.manifest import read_manifest

        read_manifest(args.data)  # a prepared dataset, or one line before anything is loaded
    if args.tasks is None:
        return data_loss(args)
    from rrtrain.eval.tasks import check_include, parse_tasks, require_lm_eval, result_key

    tasks = parse_tasks(args.tasks)
    include = check_include(args.include)
    from rrtrain.eval.results import check_target

    if args.out is not None:  # the user's own directory (a file in the way: one line), before torch is imported
        check_target(Path(args.run_dir), args.out)
    require_lm_eval("rrtrain eval")
    import torch

    from rrtrain.artifact import load_run

    run_dir = run_with_model(args)
    check_target(run_dir, args.out)  # where the result goes is the user's alone: before anything is loaded
    from rrtrain.core import dist

    info = dist.setup(timeout_s=1800)  # under torchrun: one rank per device; else one process
    if info.world_size > 1 and args.device is not None:
        raise UsageError("--device: under torchrun each rank takes its own device (leave --device out)")
    device = info.device if info.world_size > 1 else torch.device(
        args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: no CUDA device here")

    from rrtrain.eval import harness, results
    from rrtrain.eval.generate import cached_forward
    from rrtrain.eval.lm import RRTrainLM, Share
    from rrtrain.eval.tasks import check_generation, load_tasks, task_manager

    manager = task_manager(tasks, include)
    loaded = load_tasks(manager, tasks, args.num_fewshot)
    run = load_run(run_dir, args.step, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                   device=device, data_path=dataset_of(args, run_dir))
    check_generation(loaded, run.model.shape.seq_len)
    if args.data is not None and info.is_main:
        print(validation_line(run, args.data, args.batch_size, device), flush=True)
    share = Share(info.rank, info.world_size, dist.gather_objects) if info.world_size > 1 else Share()
    lm = RRTrainLM(run.model, run.tokenizer, run.model.shape.seq_len, device=device, batch_size=args.batch_size,
                   share=share, cached=cached_forward(run.model))
    t0 = time.perf_counter()
    with torch.no_grad():
        found = harness.run(lm, loaded, args.limit, args.bootstrap_iters)
    seconds = time.perf_counter() - t0
    if not info.is_main:  # every rank computed the same metrics from the gathered scores: rank 0 reports them
        dist.teardown()
        return 0
    content = results.content(run.step, tasks, args.num_fewshot, args.limit, seconds, harness.lm_eval_version(),
                              found)
    path = results.write(run_dir, run.step, result_key(tasks, args.num_fewshot, args.limit), content, args.out)
    print(f"rrtrain eval: {run_dir} step {run.step} ({run.config.model.variant}), {seconds:.1f} s", flush=True)
    print(results.table(found))
    print(f"wrote {path}")
    dist.teardown()
    return 0


def dataset_of(args: argparse.Namespace, run_dir) -> "str | None":  # noqa: ANN001 - a Path
    """The dataset whose manifest gives the tokenizer: --data, else None (the run's data.path), else a mixture
    run's first source (its sources share one tokenizer)."""
    if args.data is not None:
        return args.data
    from rrtrain.data.sources import tokenizer_path
    from rrtrain.artifact import read_run_config

    data = read_run_config(run_dir).data
    return None if data.path is not None else tokenizer_path(data)


def validation_line(run, data: str, batch_size: int, device) -> str:  # noqa: ANN001 - a LoadedRun, a device
    """The loaded model's mean next-token loss over every row of `data`'s validation split, as one line."""
    import math
    import tempfile

    import torch

    from rrtrain.data.loader import eval_batches
    from rrtrain.data.manifest import read_manifest

    manifest = read_manifest(data)
    if manifest["seq_len"] > run.shape.seq_len:
        raise UsageError(f"--data {data}: its rows of {manifest['seq_len']} tokens are longer than the model's "
                         f"seq_len {run.shape.seq_len}")
    n = int(manifest["splits"].get("val", {}).get("samples") or 0)
    if n < 1:
        raise UsageError(f"--data {data}: its validation split is empty")
    total, count = 0.0, 0
    with tempfile.TemporaryDirectory(prefix="rrtrain-eval-") as cache, torch.no_grad():
        batches = eval_batches(data, micro_batch=batch_size, n_batches=math.ceil(n / batch_size), rank=0,
                               world_size=1, cache_dir=cache, manifest=manifest)
        for b, batch in enumerate(batches):
            batch = batch[: n - b * batch_size].to(device)  # the last batch: the split's rest, not a wrap-around
            loss = run.model(batch[:, :-1], batch[:, 1:])
            total += float(loss) * len(batch)
            count += len(batch)
    return f"rrtrain eval: validation loss on {data}: {total / count:.4f} ({count} sequences, step {run.step})"


def run_with_model(args: argparse.Namespace) -> Path:
    """RUN_DIR, checked to hold a model (an artifact or a checkpoint) at `--step` when one is given; one line else."""
    from rrtrain.artifact import model_steps, require_run_dir

    run_dir = require_run_dir(args.run_dir)
    steps = model_steps(run_dir)
    if not steps:
        raise UsageError(f"{run_dir} has no checkpoint and no model artifact")
    if args.step is not None and args.step not in steps:
        raise UsageError(f"{run_dir} has no model at step {args.step} (steps: {', '.join(map(str, steps))})")
    return run_dir


def data_loss(args: argparse.Namespace) -> int:
    """`rrtrain eval RUN --data DIR` without tasks: the loss on DIR's validation split, nothing written."""
    import torch

    from rrtrain.artifact import load_run

    run_dir = run_with_model(args)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: no CUDA device here")
    run = load_run(run_dir, args.step, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                   device=device, data_path=args.data)
    print(validation_line(run, args.data, args.batch_size, device), flush=True)
    return 0

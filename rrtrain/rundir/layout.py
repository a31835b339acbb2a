"""Every name in a run directory, in one place, and how runs are found under a sweep directory.

A run directory holds:

- `config.yaml`     the resolved config the run trained with (rank 0, at the start);
- `parametrization.json` under model.parametrization mup/completep: its multipliers and the optimizer's groups
                    (rank 0, at the start; rrtrain/parallel/adamw.py `parametrization_record`);
- `metrics.jsonl`   one JSON object per line: training, evaluation, diagnostic, flag and checkpoint records;
- `tb/`             the TensorBoard mirror of `metrics.jsonl`;
- `checkpoints/`    published checkpoints (`stepN/`) and the `latest` pointer;
- `data_cache/HOST/` the loader's shard cache, one per node, unless `data.cache_dir` puts it elsewhere;
- `final.json`      written once, when the run ends for any reason: status, reason, progress, flags;
- `run.lock`        names the live writer (host, pid, job); its mtime is the writer's heartbeat;
- `cancelled.json`  written by `rrtrain sweep --cancel-flagged` before it stops the run: why, which flags, when;
- `pause.json`      written by `rrtrain sweep` before it starts a run of a pruned sweep: the step to pause at
                    (a rung of its successive halving; `launchers.prune.rule`); absent: train to the end;
- `ranks/`          where each rank of a distributed run ran (`rrtrain.rundir.ranks`);
- `wandb/`          W&B's own files, with `log.wandb` and no `$WANDB_DIR` (`rrtrain.monitoring.wandb_logger`);
- `artifact/`       the consumable model (`step_NNNNNNNN/`: model.safetensors, model.json, the tokenizer), written
                    at the end and every `train.artifact_every` steps (rrtrain/training/artifact.py);
- `init.json`       where a warm start's weights came from (`init.from`: source and sha256);
- `eval/`           `rrtrain eval`'s results, `step_NNNNNNNN-KEY.json` per checkpoint step and task set (read with
                    the in-loop downstream records by `rrtrain.rundir.downstream`).

Any directory holding `final.json` or `metrics.jsonl`, at any depth, is a run; one with `metrics.jsonl` and no
`final.json` is still going (or died without a word).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
TENSORBOARD = "tb"
CHECKPOINTS = "checkpoints"
DATA_CACHE = "data_cache"
FINAL = "final.json"
LOCK = "run.lock"
CANCELLED = "cancelled.json"
PAUSE = "pause.json"
RANKS = "ranks"
WANDB = "wandb"
EVAL = "eval"
ARTIFACT = "artifact"
INIT = "init.json"
PARAMETRIZATION = "parametrization.json"

#: the files whose presence makes a directory a run
RUN_FILES = frozenset({FINAL, METRICS})
#: directory names never searched for runs: large, and never holding one
NOT_RUNS = frozenset({CHECKPOINTS, ARTIFACT, TENSORBOARD, DATA_CACHE, WANDB, "__pycache__", ".git"})
#: directory names not searched inside a run (the run's own), but searched elsewhere: a sweep may well keep runs
#: under a directory called `eval`
RUN_PARTS = frozenset({EVAL})


def is_run_dir(filenames: Iterable[str]) -> bool:
    """Whether a directory listing is that of a run."""
    return not RUN_FILES.isdisjoint(filenames)


def run_dirs(sweep_dir: str | os.PathLike[str], skip: Optional[list[Path]] = None) -> list[Path]:
    """Every run directory under `sweep_dir` (any depth, `sweep_dir` itself included), sorted.

    `skip` lists directories not to search (e.g. the report's own output directory)."""
    root = Path(sweep_dir)
    skipped = {p.resolve() for p in (skip or [])}
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        inside_run = is_run_dir(filenames)
        dirnames[:] = sorted(d for d in dirnames
                             if d not in NOT_RUNS and not (inside_run and d in RUN_PARTS)
                             and not (skipped and (here / d).resolve() in skipped))
        if inside_run:
            found.append(here)
    return sorted(found)

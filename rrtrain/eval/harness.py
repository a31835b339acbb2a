"""One evaluation through lm-eval's `evaluate`, and its metrics flattened to `{task: {metric: value}}`.

`lm_eval.evaluator.evaluate` is called rather than `simple_evaluate`: the latter also gathers the machine's
environment (torch's collect_env, git), seconds that an evaluation inside training should not spend; the
tasks are loaded and their few-shot counts set as it would (rrtrain.eval.tasks.load_tasks). lm-eval seeds
Python's, NumPy's and torch's global generators; here they are put back as they were afterwards, so an
evaluation inside training leaves the run's random state as it found it.
"""

from __future__ import annotations

import math
import random
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import numpy as np
import torch

#: lm-eval's seeds (simple_evaluate's defaults): Python's `random` 0, NumPy's and torch's 1234
SEEDS = (0, 1234, 1234)


def lm_eval_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return "unknown"


@contextmanager
def kept_random_state() -> Iterator[None]:
    """Python's, NumPy's and torch's (CPU and CUDA) global generators restored on the way out."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def run(lm: Any, loaded: dict, limit: Optional[int], bootstrap_iters: int = 0) -> dict[str, dict[str, Optional[float]]]:
    """Evaluate `lm` on the tasks `loaded` (rrtrain.eval.tasks.load_tasks); `bootstrap_iters` = 0 computes no
    bootstrapped standard error (those of a mean are exact and always given)."""
    import logging

    from lm_eval.evaluator import evaluate

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    with kept_random_state():
        random.seed(SEEDS[0])
        np.random.seed(SEEDS[1])
        torch.manual_seed(SEEDS[2])
        out = evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=bootstrap_iters, log_samples=False,
                       verbosity="ERROR")
    return flatten(out["results"])


def flatten(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Optional[float]]]:
    """lm-eval's `{task: {"acc,none": v, "acc_stderr,none": s, "alias": ...}}` -> `{task: {"acc": v,
    "acc_stderr": s}}`: the `,none` filter suffix dropped (another filter's name is kept after a dot:
    `exact_match.strict-match`), only numbers kept, a non-finite number or a missing stderr ("N/A") as None."""
    out: dict[str, dict[str, Optional[float]]] = {}
    for task, metrics in results.items():
        flat: dict[str, Optional[float]] = {}
        for key, value in metrics.items():
            if "," not in key:
                continue  # alias, sample counts: not metrics
            name, _, filt = key.partition(",")
            if filt != "none":
                base, stderr = (name[:-len("_stderr")], "_stderr") if name.endswith("_stderr") else (name, "")
                name = f"{base}.{filt}{stderr}"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                flat[name] = float(value) if math.isfinite(value) else None
            elif name.endswith("_stderr"):
                flat[name] = None
        out[task] = flat
    return out


def records(results: dict[str, dict[str, Optional[float]]]) -> dict[str, Optional[float]]:
    """`downstream/<task>/<metric>` for the metrics.jsonl record: every metric, no standard errors."""
    return {f"downstream/{task}/{name}": value for task, metrics in sorted(results.items())
            for name, value in sorted(metrics.items()) if not name.endswith("_stderr")}

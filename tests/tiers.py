"""The fast tier's guard (`make test-fast`: tests/unit without the `slow` mark, with RRTRAIN_TEST_TIER=fast).

The tier's promise is that it trains nothing in a subprocess and starts no torchrun, no browser and nothing of
the Slurm cluster, so that it stays a few minutes on two cores. Rather than trust the marks, the guard wraps
`subprocess.Popen` (which `subprocess.run`, asyncio's subprocesses and Playwright's driver go through) in the
tier's processes:

- torchrun, the local executor's warm interpreter of training runs, a browser or its driver, a Slurm client or daemon installed on the machine (a stand-in script a test
  puts first on PATH is not the cluster): the test fails at once;
- a training start (`python -m rrtrain.train`, `rrtrain train | demo | bench | sweep`, runpy on rrtrain.train):
  allowed only as a refusal, so a test of a bad input's one-line error stays in the tier; the test fails at its
  end if such a process did not exit with status 2 (it trained, or still runs).

A test that fails here belongs outside the tier: mark it `@pytest.mark.slow` (`make test` runs it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any, Optional

import pytest

TIER_ENV = "RRTRAIN_TEST_TIER"
REFUSED = 2  # rrtrain's exit status for bad input (UsageError): nothing was trained

BROWSER = re.compile(r"playwright|chrom(e|ium)")
SLURM = {"sbatch", "srun", "salloc", "squeue", "scontrol", "scancel", "sacct", "sinfo", "slurmd", "slurmctld"}
TRAINING_SUBCOMMANDS = {"train", "demo", "bench", "sweep"}
SWEEP_WITHOUT_TRAINING = {"--dry-run", "--cancel-flagged", "--cancel"}
RUNPY_TRAIN = re.compile(r"run_module\(\s*['\"]rrtrain\.train['\"]")

_launched: list[tuple[str, subprocess.Popen]] = []  # training starts of the running test, checked at its end


def fast_tier() -> bool:
    return os.environ.get(TIER_ENV) == "fast"


def _argv(args: Any) -> list[str]:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    return [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]


def forbidden(args: Any, env: Optional[dict] = None) -> Optional[str]:
    """What the fast tier never starts, named; None when `args` (Popen's first argument) is none of it."""
    argv = _argv(args)
    if not argv:
        return None
    if os.path.basename(argv[0]) == "torchrun" or _module(argv) == "torch.distributed.run":
        return "torchrun"
    if any(a.endswith("launchers/executors/warm.py") for a in argv) and "rrtrain.train" in argv:
        return "the warm interpreter of a sweep's training runs (launchers.executors.warm)"
    if any(BROWSER.search(a) for a in argv):
        return f"a browser ('{argv[0][:80]}')"
    if os.path.basename(argv[0]) in SLURM and _installed(argv[0], env):
        return f"the Slurm cluster ('{argv[0]}')"
    return None


def training(args: Any) -> Optional[str]:
    """The training start `args` is, named (allowed in the tier only as a refusal); None when it is none."""
    argv = _argv(args)
    if _module(argv) == "rrtrain.train" or any(RUNPY_TRAIN.search(a) for a in argv):
        return "rrtrain.train"
    sub = _rrtrain_subcommand(argv)
    if sub in TRAINING_SUBCOMMANDS and not (sub == "sweep" and SWEEP_WITHOUT_TRAINING & set(argv)):
        return f"rrtrain {sub}"
    return None


def _module(argv: Sequence[str]) -> Optional[str]:
    """M of `python -m M ...`."""
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"), None)


def _rrtrain_subcommand(argv: Sequence[str]) -> Optional[str]:
    """`train` of `python -m rrtrain train ...` or `rrtrain train ...`."""
    for i, a in enumerate(argv[:-1]):
        if (a == "rrtrain" and (i == 0 or argv[i - 1] == "-m")) or a.endswith("/rrtrain"):
            return argv[i + 1]
    return None


def _installed(cmd: str, env: Optional[dict]) -> bool:
    """Whether `cmd` is the machine's own program rather than a test's stand-in in a temporary folder."""
    found = shutil.which(cmd, path=(env or os.environ).get("PATH"))
    if found is None:
        return False  # nothing to start: Popen says so itself
    return not os.path.realpath(found).startswith(os.path.realpath(tempfile.gettempdir()) + os.sep)


def install_guard() -> None:
    """Wrap Popen once per process. pytest's Failed is a BaseException: a test's `except Exception` does not
    swallow it."""
    if getattr(subprocess.Popen, "_rrtrain_tier_guard", False):
        return
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        why = forbidden(args, kwargs.get("env"))
        if why is not None:
            pytest.fail(f"the fast tier (make test-fast) starts no torchrun, browser or cluster, and this test "
                        f"started {why}: mark it @pytest.mark.slow (make test runs it)", pytrace=False)
        original(self, args, *rest, **kwargs)
        what = training(args)
        if what is not None:
            _launched.append((what, self))

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
    subprocess.Popen._rrtrain_tier_guard = True  # type: ignore[attr-defined]


def check_launches() -> None:
    """At a test's end: every training start it made (its fixtures' included) was refused, exit status 2."""
    trained = []
    for what, proc in _launched:
        code = proc.poll()
        if code != REFUSED:
            trained.append(f"{what} ({'still running' if code is None else f'exit {code}'})")
    _launched.clear()
    if trained:
        pytest.fail(f"the fast tier (make test-fast) trains nothing in a subprocess, and this test (or a fixture "
                    f"it uses) started {', '.join(trained)}, not refused with exit {REFUSED}: mark it "
                    f"@pytest.mark.slow (make test runs it)", pytrace=False)

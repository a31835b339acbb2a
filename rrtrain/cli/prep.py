"""`rrtrain prep ...`: data_prep's command line (data_prep/cli.py), with the sweep side's executors for
`--executor local|slurm --tasks N` (data_prep.cluster): the same `local` and `slurm` executors that run a sweep's
runs run prep's array tasks (`launchers.executors.base.ArrayExecutor.run_array`). data_prep stands below the
launchers and does not import them; this module, at the top, hands them down."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable


def executor_for(cluster: Any, opts: Any) -> Any:
    """The executor `--executor` names: local subprocesses (every task at once), or a Slurm job array of CPU tasks
    (`--workers` CPUs, `--mem-gb`, `--time-min`, `--partition` each)."""
    if cluster.executor == "slurm":
        from launchers.executors.slurm import SlurmExecutor
        from launchers.sweep.spec import Resources

        return SlurmExecutor(Resources(cpus_per_task=opts.workers, mem_gb=cluster.mem_gb, time_min=cluster.time_min,
                                       partition=cluster.partition))
    from launchers.executors.local import LocalExecutor

    return LocalExecutor(sys.executable, parallel=cluster.tasks)


def array_runner(cluster: Any, opts: Any) -> Callable[[Any, int, Path, str], object]:
    """`data_prep.cluster.RunArray` over `executor_for`'s executor: a failed task is a UsageError with its own one
    line (without its "rrtrain prep: error: "), Ctrl-C a KeyboardInterrupt."""
    from launchers.executors.base import Interrupted, SubmitError
    from rrtrain.core.errors import UsageError

    executor = executor_for(cluster, opts)

    def run(task: Any, count: int, folder: Path, label: str) -> object:
        try:
            return executor.run_array(task, count, folder, label)
        except SubmitError as err:
            raise UsageError(str(err).replace("rrtrain prep: error: ", "")) from None
        except Interrupted:
            raise KeyboardInterrupt from None

    return run


def main(argv: list[str]) -> int:
    from data_prep.cli import main as prep_main

    return prep_main(argv, run_array_for=array_runner)

"""The one interface of an executor: `submit(runs, sweep_dir, name, code)` hands a sweep's runs over and says what
became of each. Modelled on submitit's executors (an object set up once with its parameters, then given work):
the submit loop (`launchers.submit`) neither knows nor asks which executor it holds, and a new executor is one
class with this method (docs/architecture.md, "Where a newcomer adds")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:
    from launchers.sweep.expand import Run


@dataclass
class Submitted:
    """What one submission did: each run's job id (`slurm`: ARRAY_TASK; `local`: local:PID; `debug`), recorded in
    sweep.json, and, for an executor that waits (`Executor.waits`), each run's exit status."""

    jobs: dict[str, Optional[str]]
    codes: dict[str, int]


class Executor(Protocol):
    """Where a sweep's runs train. `name` is what sweep.json records for the submission (`slurm`, `local`,
    `debug`); `waits` says whether `submit` returns once the runs ended (True: `codes` holds each exit status)
    or once they are queued (False: `codes` is empty, and the runs' own files say later how they went)."""

    name: str
    waits: bool

    def submit(self, runs: list[Run], sweep_dir: Path, name: str, code: str) -> Submitted:
        """Train `runs` of the sweep in `sweep_dir` (sweep `name`, its code snapshot at `code`): each run's
        config is `launchers.executors.entry.config_path(sweep_dir, run.id)`. Raises `SubmitError` when a
        submission failed part-way, `Interrupted` when the user stopped the runs."""
        ...


class ArrayTask(Protocol):
    """Work split into numbered tasks that need no GPU (`rrtrain prep --tasks N`, data_prep.cluster): `task(i)` runs
    task i in this process (a Slurm array task, pickled by submitit) and `argv(python, i)` is the same as a command
    line (the local executor's subprocess). It raises, or exits non-zero, when the task failed. Its attributes are
    plain JSON values: a Slurm task checks submitit's pickle of it against them before unpickling it
    (launchers.executors.slurm.task_seal_lines)."""

    def __call__(self, index: int) -> Any: ...

    def argv(self, python: str, index: int) -> list[str]: ...


class ArrayExecutor(Protocol):
    """An executor that also runs an `ArrayTask`'s tasks 0..count-1 and waits for all of them (`local`, `slurm`);
    `folder` (a private directory of the caller's) holds their logs. Returns each task's job id; raises
    `SubmitError` naming the first task that failed and its last line of output, `Interrupted` on Ctrl-C."""

    name: str

    def run_array(self, task: ArrayTask, count: int, folder: Path, label: str) -> dict[int, Optional[str]]: ...


class SubmitError(RuntimeError):
    """A submission that failed part-way; `jobs` holds what was queued before it (recorded all the same)."""

    def __init__(self, message: str, jobs: dict[str, Optional[str]]) -> None:
        super().__init__(message)
        self.jobs = jobs


class Interrupted(Exception):
    """The user interrupted runs that trained here; they stopped at a step boundary and resume when submitted
    again (already said on stdout)."""

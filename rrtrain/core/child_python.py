"""How rrtrain starts a Python child, the one place that says so: `python -P -m MODULE ARGS` with PYTHONSAFEPATH=1
in its environment.

Python puts the current directory first on sys.path for `python -m X` (and `-c`): a co-tenant who can write the
directory the user runs rrtrain from would run code as the user by planting `rrtrain/__init__.py`,
`tensorboard/__init__.py` or `data_prep/__init__.py` there. `-P` (Python 3.11's safe_path) leaves it off;
PYTHONSAFEPATH=1 does the same for what the child starts in turn, whose command lines rrtrain does not build
(torchrun's workers, `python -u -m rrtrain.train`; multiprocessing's spawned processes; submitit's tasks).
PYTHONPATH still counts: the sweep's verified code snapshot is put first on it explicitly
(launchers.executors.local, the job scripts), never reached through the current directory.
Python 3.10 has neither: there the child starts through `-c` with a line that drops the current directory from
sys.path before it imports anything, then runs the module as `-m` does (runpy), so that the command line still
names the module (rrtrain.rundir.lock reads it); what such a child starts in turn is not covered."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator, Mapping, Optional

#: the environment variable that keeps the current directory off every Python child's sys.path (3.11+)
SAFE_PATH_ENV = "PYTHONSAFEPATH"

#: whether this interpreter (the one every child runs: sys.executable) knows `-P` and PYTHONSAFEPATH
HAS_SAFE_PATH = sys.version_info >= (3, 11)

#: Python 3.10's stand-in for `-P -m`: sys.path[0] is the current directory ('') until this line drops it
BOOTSTRAP = "import sys; del sys.path[0]; import runpy; runpy._run_module_as_main(sys.argv.pop(1))"


def module_argv(module: str, *args: str, python: str = sys.executable, safe_path: bool = HAS_SAFE_PATH) -> list[str]:
    """The command line that runs `python -m module args` with nothing imported from the current directory.
    `python` is this interpreter (or one of its version: the job scripts name sys.executable)."""
    if safe_path:
        return [python, "-P", "-m", module, *args]
    return [python, "-c", BOOTSTRAP, module, *args]


#: where `module_argv` puts the module's name: what comes before it is the interpreter's
MODULE_AT = 3

#: Python 3.10's stand-in for `-P script`: run with `-c`, whose sys.path[0] (the working folder) this line drops
#: before it runs the script, which `run_path` does not add to the path
SCRIPT_BOOTSTRAP = "import runpy, sys; del sys.path[0]; runpy.run_path(sys.argv.pop(1), run_name='__main__')"


def script_argv(path: str, *args: str, python: str = sys.executable, safe_path: bool = HAS_SAFE_PATH) -> list[str]:
    """The command line that runs the script at `path` with nothing imported from its folder (`-P`; on 3.10 the
    folder is dropped from sys.path before the script runs): for a file of rrtrain's own that must import the
    rest of its code from PYTHONPATH, not from beside itself (the local executor's warm server)."""
    if safe_path:
        return [python, "-P", path, *args]
    return [python, "-c", SCRIPT_BOOTSTRAP, path, *args]


def child_env(base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """`base` (default: this process's environment) with PYTHONSAFEPATH=1: the environment of every child."""
    env = dict(os.environ if base is None else base)
    env[SAFE_PATH_ENV] = "1"
    return env


#: the same as a line of a job script: every Python the job starts (srun's tasks, torchrun's agents and workers)
SHELL_EXPORT = f"export {SAFE_PATH_ENV}=1"


@contextlib.contextmanager
def environ_while(name: str, value: str) -> Iterator[None]:
    """`name=value` in this process's own environment for the block, then as it was: for what a library reads
    from the environment itself, or passes on to the children it starts."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def safe_path_while_starting() -> contextlib.AbstractContextManager[None]:
    """PYTHONSAFEPATH=1 for the block: children a library starts itself (multiprocessing's spawned workers run
    `python -c ...` in the current directory) import nothing from there."""
    return environ_while(SAFE_PATH_ENV, "1")

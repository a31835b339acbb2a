"""Fixtures shared across the test suite."""

from __future__ import annotations

import gc

# What collection imports (torch, every test module) lives as long as the session and is frozen at its end
# (pytest_collection_finish): the cyclic collector, off until collection has ended (pytest_collection, in every
# process: xdist's controller collects nothing), would only walk it again and again.
gc.disable()

import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models on 2 shared cores run faster on one thread; subprocesses get OMP_NUM_THREADS=1 (trainutil.env).
torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiers  # noqa: E402
import xdist_groups  # noqa: E402
from trainutil import prep_stories, stop_server  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def own_config_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The user's key for marking Slurm jobs (launchers.sweep.job_token) in a directory of the test session's,
    not in the home directory of whoever runs the suite."""
    saved = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield
    if saved is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = saved


@pytest.fixture(scope="session")
def stories_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level synthetic-stories dataset (seq_len 64), prepared once per test session."""
    return prep_stories(tmp_path_factory.mktemp("data") / "stories")


TESTS = Path(__file__).resolve().parent
SLURM_TESTS = TESTS / "slurm"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `make test` (pytest-xdist, four workers, `--dist loadgroup` scheduled by tests/xdist_groups.py)
    the tests that use the local Slurm cluster share it: they form one group, run by one worker in order.
    tests/slurm comes first, so that the group's long chain of scheduler waits overlaps the rest of the suite on
    the other workers; its tests that need no cluster (the LocalExecutor, the rendezvous) stay out of the group.
    Every other test goes with the rest of its file: a module's fixtures (a sweep trained for the dashboard, an
    HSDP run) are then built once, not once per worker, and a file with a test on the cluster goes to the group
    whole. The rest are handed out longest first (`LONGEST_FIRST`). Four workers on two cores: the Slurm group's
    worker mostly waits on the scheduler, and so do tests that wait on a signal, a browser or a rendezvous (the
    same length as three in a fresh-clone run, 24 minutes: the cores are busy throughout)."""
    in_slurm = {item.nodeid: Path(item.path).resolve().is_relative_to(SLURM_TESTS) for item in items}
    on_cluster = {item.path for item in items if "cluster_session" in getattr(item, "fixturenames", ())}
    for item in items:  # a file with one test on the cluster goes whole: its other tests share its fixtures
        item.add_marker(pytest.mark.xdist_group("slurm" if item.path in on_cluster else Path(item.path).stem))
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    starting = {item.path for item in items if item.get_closest_marker("slow")}  # files that start processes
    rest = sorted((item for item in items if not in_slurm[item.nodeid]),  # stable: a file's tests keep their order
                  key=lambda item: (first.get(_under_tests(item), len(first)), _rank_of_folder(item),
                                    item.path not in starting))
    items[:] = [item for item in items if in_slurm[item.nodeid]] + rest


#: The files whose tests take a minute or more of wall time in a full `make test` (measured: the sum of their
#: tests' durations), longest first: handed out right after the Slurm group, so that short tests fill the workers'
#: ends. Started last, the demo alone (5-6 minutes on a loaded machine) was the suite's tail; so were the
#: training tests of e2e/ after the unit tests, whose folder pytest collects first (a worker ended 100 s after the
#: others on the one-minute compiled-blocks test). Scheduling only: no test depends on it.
LONGEST_FIRST = ("e2e/test_demo.py", "e2e/test_external_rule.py", "unit/rrtrain/residuals/test_compile_rules.py",
                 "e2e/test_docs_commands.py", "e2e/test_gpu_device_script.py", "e2e/test_sweep_local.py",
                 "distributed/test_rules_49_train.py", "e2e/test_integrity_chaos.py", "e2e/test_train_single.py",
                 "e2e/test_sweep_prune.py", "e2e/test_dashboard.py", "unit/rrtrain/export/test_export_hf.py",
                 "distributed/test_fsdp.py", "distributed/test_plan_measured.py", "distributed/test_deepspeed.py",
                 "e2e/test_eval.py", "e2e/test_concurrent_starts.py")
#: After those, the other files by folder: those that train in subprocesses before the unit tests, most of which
#: take a second or less; within a folder, the files with a test that starts processes (`slow`) first, which
#: wait on them as much as they compute, so that fewer of the suite's last minutes are waits (one run each way
#: could not tell the difference: the last two minutes stay at 100-160% of the two cores).
#: (tests/slurm's files come first whatever this says: the Slurm group and, after it, its tests that need no
#: cluster, the LocalExecutor's time limit and the rendezvous among them.)
FOLDER_ORDER = ("e2e", "distributed", "slurm", "unit")


def _rank_of_folder(item: pytest.Item) -> int:
    folder = _under_tests(item).split("/", 1)[0]
    return FOLDER_ORDER.index(folder) if folder in FOLDER_ORDER else len(FOLDER_ORDER)


def _under_tests(item: pytest.Item) -> str:
    return Path(item.path).resolve().relative_to(TESTS).as_posix()


#: How much lower than the Slurm group's the priority of the other tests' processes is under `make test`.
BACKGROUND_NICE = 5


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under `make test`, a worker lowers its own priority (and so that of what it starts from then on) before its
    first test outside the Slurm group. The group is a chain of jobs, each waiting on the one before, and the
    longest path through the suite; its processes then get the cores when they need them, and the other
    workers' tests take the rest. Nothing is timed by this: it orders who runs first, not whether a test passes."""
    global _niced
    if os.environ.get("PYTEST_XDIST_WORKER") and not _niced and xdist_groups.group_of(item) != "slurm":
        os.nice(BACKGROUND_NICE)
        _niced = True


_niced = False  # this worker lowered its priority already (os.nice adds to it at each call)


# `--dist loadgroup` by tests/xdist_groups.py's scheduler: the groups travel in a file, not in node ids (which
# pytest 9.2 no longer lets pytest-xdist rewrite). optionalhook: without pytest-xdist these hooks do nothing.
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001 - xdist's WorkerController
    xdist_groups.configure_node(node.config, node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 - xdist's Producer, Scheduling
    if config.getvalue("dist") == "loadgroup":
        return xdist_groups.GroupScheduling(config, log)
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker sends the collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    xdist_groups.write_groups(session)
    # What collection built (every module, item and fixture definition: most of a worker's heap) lives as long as
    # the session: out of the collector's reach, a full collection no longer walks it (each one did, hundreds of
    # times over a worker's tests).
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):  # noqa: ANN201 - a hook wrapper's result is the hook's
    """The cyclic collector back on once collection has ended, in the workers and in xdist's controller alike (it
    skips collection, and with it pytest_collection_finish)."""
    try:
        return (yield)
    finally:
        gc.enable()


def pytest_configure(config: pytest.Config) -> None:
    if tiers.fast_tier():  # make test-fast: a test that trains in a subprocess, or starts torchrun, a browser or
        tiers.install_guard()  # the Slurm cluster, fails (tests/tiers.py)


#: what makes a process take itself for one rank of several (torch's env:// rendezvous, accelerate, DeepSpeed)
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def _no_launch_variables_left() -> Iterator[None]:
    """A test that leaves a launcher's variable in this worker's environment (a library run in-process sets
    LOCAL_RANK) fails: every later test's subprocesses inherit it (accelerate then started a process group in an
    lm-eval subprocess of another test, and failed on the missing RANK)."""
    before = {k: os.environ.get(k) for k in LAUNCH_VARIABLES}
    yield
    left = {k: os.environ[k] for k in LAUNCH_VARIABLES if os.environ.get(k) != before[k]}
    if left:
        for k, v in before.items():  # the next tests start clean
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        pytest.fail(f"the test left {left} in the environment of this pytest process", pytrace=False)


@pytest.fixture(autouse=True)
def _fast_tier_trains_nothing() -> Iterator[None]:
    """make test-fast: at each test's end, every training start it made was refused (tests/tiers.py)."""
    yield
    if tiers.fast_tier():
        tiers.check_launches()


def pytest_unconfigure(config: pytest.Config) -> None:
    stop_server()  # the fork server of this pytest process (tests/forkserver.py), if a test started it
    xdist_groups.unconfigure(config)

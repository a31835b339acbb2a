"""A callback of one's own (`train.callbacks: [module.path:ClassName]`): loaded from a module outside rrtrain,
handed the loop interface (not the trainer), its state checkpointed and restored like the built-ins'; a bad
entry is refused with one line and exit 2 before the run directory is touched.

Runtime: two short tiny runs (forked by the tests' fork server: about 5 s) and a few refusals in-process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import trainutil
from trainutil import PY, REPO, TINY, env, final

MODULE = "rrtrain_test_user_callbacks"

SOURCE = '''
import gc
import json

from rrtrain.training.loop import Callback


class StepCounter(Callback):
    """Counts the steps it saw, over resumes; writes what it saw of the loop at the end (and whether the cyclic
    collector ran while the run's process started, and at its first step)."""

    name = "step_counter"

    def __init__(self):
        self.steps, self.restored, self.start = 0, None, None
        self.collector = {"start-up": gc.isenabled()}

    def load_state_dict(self, state):
        self.steps = self.restored = state["steps"]

    def state_dict(self):
        return {"steps": self.steps}

    def on_start(self, loop):
        self.collector["first step"] = gc.isenabled()
        self.start = {"step": loop.step, "resumed_at": loop.resumed_at, "total_steps": loop.total_steps,
                      "interface": sorted(n for n in dir(loop) if not n.startswith("_")),
                      "type": type(loop).__name__, "seq_len": loop.facts.seq_len}

    def on_step_end(self, loop):
        self.steps += 1

    def on_end(self, loop):
        if loop.facts.is_main:
            out = {"steps": self.steps, "restored": self.restored, "start": self.start, "status": loop.status,
                   "collector": self.collector}
            (loop.facts.run_dir / "counter.json").write_text(json.dumps(out))


class Console(Callback):
    name = "console"  # the built-in console's name


class NotACallback:
    pass


class Broken(Callback):
    def __init__(self):
        raise RuntimeError("no\\nsecond line")
'''

#: what a callback can reach: the documented `rrtrain.training.loop.Loop`, nothing of the trainer
INTERFACE = ["any_rank", "facts", "last_val_loss", "logits", "metrics", "raise_flag", "reason", "request_stop",
             "resumed_at", "run_eval", "save_checkpoint", "status", "step", "tokens", "total_steps", "wall_s"]

SMALL = ["train.global_batch=4", "train.micro_batch=4", "train.eval_every=0", "train.ckpt_every=0",
         "train.log_every=2", "train.warmup_steps=1", "data.eval_batches=1", "train.compile=false"]


def user_module(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{MODULE}.py").write_text(SOURCE)
    return where


def run_from(folder: Path, cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """`cmd` (a one-process `python -m rrtrain.train ...`) started in `folder`, a user's own folder holding their
    module, which `python -m` puts first on sys.path as PYTHONPATH would (a PYTHONPATH of its own would need a
    fork server of its own): forked by the tests' fork server where one serves (tests/trainutil.py), else a plain
    process."""
    return trainutil.run_cmd(cmd, env(), timeout, cwd=folder)


def train_with(run: Path, data: Path, lib: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [PY, "-m", "rrtrain.train", TINY, f"data.path={data}", f"run.dir={run}", *SMALL,
           f"train.callbacks=[{MODULE}:StepCounter]", *overrides]
    proc = run_from(lib, cmd)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def latest_state(run: Path) -> tuple[Path, dict]:
    root = run / "checkpoints"
    path = root / (root / "latest").read_text().strip() / "train_state.json"
    return path, json.loads(path.read_text())


@pytest.mark.slow  # two `rrtrain.train` runs in a subprocess: out of make test-fast
def test_a_user_callback_is_checkpointed_and_restored_like_the_built_ins(tmp_path, stories_data):
    lib, run = user_module(tmp_path / "lib"), tmp_path / "run"
    train_with(run, stories_data, lib, "train.max_steps=4")
    seen = json.loads((run / "counter.json").read_text())
    assert seen["steps"] == 4 and seen["restored"] is None and seen["status"] == "completed"
    # the run's process starts with the cyclic collector paused (rrtrain.train._COLLECTOR_PAUSED), on from its loop
    assert seen["collector"] == {"start-up": False, "first step": True}
    assert seen["start"]["interface"] == INTERFACE and seen["start"]["type"] != "Trainer"
    assert seen["start"]["resumed_at"] is None and seen["start"]["seq_len"] == 64
    path, state = latest_state(run)
    assert state["step"] == 4 and state["callbacks"]["step_counter"] == {"steps": 4}
    assert {"monitor", "nonfinite", "step_counter"} <= set(state["callbacks"]) and "streak" not in state
    # made to look like a checkpoint from before train.callbacks existed, which also counted a `streak`
    del state["config"]["train"]["callbacks"]
    path.write_text(json.dumps({**state, "streak": 0}))

    proc = train_with(run, stories_data, lib, "train.max_steps=7", "train.allow_config_change=true")
    assert "resumed at step 4" in proc.stdout
    seen = json.loads((run / "counter.json").read_text())
    assert seen["restored"] == 4 and seen["steps"] == 7 and seen["start"]["resumed_at"] == 4
    assert seen["start"]["step"] == 4 and seen["start"]["total_steps"] == 7
    assert latest_state(run)[1]["callbacks"]["step_counter"] == {"steps": 7}
    fin = final(run)
    assert fin["status"] == "completed" and fin["step"] == 7


@pytest.mark.parametrize("entry, message", [
    ("nocolon", "is not of the form 'module.path:ClassName'"),
    ("a.b:C:D", "is not of the form"),
    (f"{MODULE}_missing:StepCounter", "cannot import"),
    (f"{MODULE}:Missing", "no such name"),
    (f"{MODULE}:NotACallback", "not a subclass of Callback"),
    (f"{MODULE}:Console", "like the built-in Console"),
    (f"{MODULE}:Broken", "Broken() failed: RuntimeError: no"),
])
def test_a_bad_callback_entry_exits_2_with_one_line(tmp_path, monkeypatch, capsys, stories_data, entry, message):
    from rrtrain.cli import main as cli

    monkeypatch.syspath_prepend(str(user_module(tmp_path / "lib")))
    monkeypatch.delitem(__import__("sys").modules, MODULE, raising=False)
    run = tmp_path / "run"
    code = cli.main(["train", TINY, f"data.path={stories_data}", f"run.dir={run}", f"train.callbacks=[{entry}]"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "train.callbacks" in err and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not run.exists()  # refused before the run directory was made or locked


def test_two_entries_for_one_class_are_refused(tmp_path):
    from rrtrain.config import load_config
    from rrtrain.core.errors import UsageError

    with pytest.raises(UsageError, match="listed twice"):
        load_config(TINY, [f"train.callbacks=[{MODULE}:A, {MODULE}:A]"])
    with pytest.raises(UsageError, match="train.callbacks: expected a list"):
        load_config(TINY, [f"train.callbacks={MODULE}:A"])
    assert load_config(TINY, []).train.callbacks == []


def test_the_user_guide_example_is_a_working_callback():
    """docs/user-guide.md's example: a `Callback` that stops, at its cadence only, once its budget is spent."""
    import re
    from types import SimpleNamespace

    from rrtrain.training.loop import Callback

    guide = (REPO / "docs" / "user-guide.md").read_text()
    section = guide[guide.index("## Your own callback"):]
    source = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(source.strip().splitlines()) < 25
    namespace: dict = {}
    exec(compile(source, "user-guide example", "exec"), namespace)
    budget = namespace["WallBudget"]()
    assert isinstance(budget, Callback) and budget.name == "wall_budget"
    stops: list[tuple] = []
    loop = SimpleNamespace(step=49, any_rank=lambda flag: flag, request_stop=lambda *a: stops.append(a))
    budget.hours = 0.0
    budget.on_step_end(loop)  # off its cadence: no collective, no stop
    loop.step = 50
    budget.on_step_end(loop)
    assert stops == [("preempted", "0.0 h spent at step 50")] and budget.state_dict() == {"stops": 1}
    budget.load_state_dict({"stops": 3})
    assert budget.state_dict() == {"stops": 3}


def test_the_callback_interface_loads_no_torch():
    """A user's callback module imports `rrtrain.training.loop` cheaply: no torch, no trainer."""
    code = "import json, sys, rrtrain.training.loop; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout))
    assert "rrtrain.training.loop" in loaded and "torch" not in loaded and "rrtrain.training.trainer" not in loaded


def test_importing_the_training_module_leaves_the_collector_alone():
    """Only a run's own process (`python -m rrtrain.train`) pauses the cyclic collector through its start-up."""
    import gc

    import rrtrain.train

    assert gc.isenabled() and not rrtrain.train._COLLECTOR_PAUSED

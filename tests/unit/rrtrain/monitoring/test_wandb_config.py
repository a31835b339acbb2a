"""`log.wandb` without a training run: the section's checks, the resume rule, the sweep's group, the W&B run id,
and that nothing loads wandb unless it is configured (the real runs: tests/e2e/test_wandb_logger.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from launchers.sweep import spec
from launchers.sweep.expand import data_path, expand
from rrtrain.config import Config, WandbConfig, load_config
from rrtrain.core.errors import UsageError
from rrtrain.training.checkpoint import check_resume
from trainutil import PY, REPO, env


@pytest.mark.parametrize("override, message", [
    ("log.wandb.projct=x", "unknown key 'log.wandb.projct'; did you mean 'log.wandb.project'?"),
    ("log.wnadb.mode=offline", "unknown key 'log.wnadb'; did you mean 'log.wandb'?"),
    ("log.wandb.mode=ofline", "log.wandb.mode: expected one of 'online', 'offline', 'disabled' or null"),
    ("log.wandb.project=a/b", "log.wandb.project: W&B refuses the characters '/'"),
    ("log.wandb.entity=", "log.wandb.entity must be 1 to 128 characters"),
    ("log.wandb.group=" + "g" * 129, "log.wandb.group must be 1 to 128 characters"),
])
def test_bad_log_wandb_values_get_one_line_naming_the_key(override, message):
    with pytest.raises(UsageError) as err:
        load_config(None, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_log_wandb_is_off_unless_given_and_an_empty_mapping_turns_it_on():
    assert load_config(None).log.wandb is None and load_config(None, ["log.wandb=null"]).log.wandb is None
    assert load_config(None, ["log.wandb={}"]).log.wandb == WandbConfig()
    w = load_config(None, ["log.wandb.mode=offline", "log.wandb.project=p"]).log.wandb
    assert (w.project, w.mode, w.entity, w.group) == ("p", "offline", None, None)


def test_turning_wandb_on_or_changing_it_on_resume_needs_no_consent():
    """A checkpoint written before the section existed, or without W&B, resumes with it (an observer)."""
    old = Config().to_dict()
    del old["log"]
    new = load_config(None, ["log.wandb.mode=offline", "log.wandb.project=p", "log.wandb.entity=e",
                             "log.wandb.group=g"]).to_dict()
    assert check_resume(old, new, 1, 1, allow=False) == []
    assert check_resume(new, Config().to_dict(), 1, 1, allow=False) == []


SWEEP = {"name": "t", "config": "tiny.yaml", "data": "/data/x", "variants": ["review", "standard"],
         "sizes": {"tiny": {"seeds": 1, "tokens": 40960}}}


def _expand(tmp_path, body):
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(body, sort_keys=False))
    sweep = spec.load(p)
    out = tmp_path / "my-sweep"
    return {r.id: r.config["log"]["wandb"] for r in expand(sweep, out, data_path(sweep, out))}


def test_a_sweeps_runs_share_one_wandb_group_named_after_its_directory(tmp_path):
    on = {**SWEEP, "overrides": {"log": {"wandb": {"mode": "offline"}}}}
    assert {rid: w["group"] for rid, w in _expand(tmp_path, on).items()} == \
        {"tiny-review-s0": "my-sweep", "tiny-standard-s0": "my-sweep"}
    given = {**SWEEP, "overrides": {"log.wandb.group": "mine"}}
    assert {w["group"] for w in _expand(tmp_path, given).values()} == {"mine"}
    assert set(_expand(tmp_path, SWEEP).values()) == {None}  # no log.wandb: none is made up


def test_the_wandb_run_id_is_the_run_directorys(tmp_path):
    from rrtrain.monitoring.wandb_logger import wandb_run_id

    a, b = tmp_path / "s1" / "tiny-review-s0", tmp_path / "s2" / "tiny-review-s0"
    assert wandb_run_id(a) == wandb_run_id(tmp_path / "s1" / ".." / "s1" / "tiny-review-s0")
    assert wandb_run_id(a) != wandb_run_id(b) and wandb_run_id(a).startswith("tiny-review-s0-")
    odd = wandb_run_id(tmp_path / "a run:with;odd,chars?" )
    assert len(odd) <= 64 and not set(odd) & set(":;,#?/' ")


def test_wandb_configured_but_not_installed_is_refused_before_the_run(monkeypatch):
    from rrtrain.monitoring.wandb_logger import WandbLogger

    monkeypatch.setitem(sys.modules, "wandb", None)  # find_spec then says: not installed
    with pytest.raises(UsageError, match=r"pip install 'rrtrain\[wandb\]'"):
        WandbLogger(WandbConfig())


def test_composing_a_run_without_log_wandb_loads_no_wandb():
    code = ("import json, sys, rrtrain, rrtrain.train as t; from rrtrain.config import load_config; "
            "from rrtrain.core.signals import StopFlag; "
            "off = [type(c).__name__ for c in t.default_callbacks(load_config(None), StopFlag())]; "
            "print(json.dumps([off, sorted(m for m in sys.modules if 'wandb' in m)])); "
            "on = t.default_callbacks(load_config(None, ['log.wandb.mode=offline']), StopFlag()); "
            "print(json.dumps([type(on[-1]).__name__, sorted(m for m in sys.modules if 'wandb' in m)]))")
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (off, loaded_off), (last_on, loaded_on) = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
    assert "WandbLogger" not in off and loaded_off == []
    assert last_on == "WandbLogger" and loaded_on == ["rrtrain.monitoring.wandb_logger"]  # wandb: when it starts

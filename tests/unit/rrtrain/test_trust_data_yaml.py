"""Every YAML rrtrain reads from users (configs, their `base:` chains, sweep files, a run's config.yaml, overrides)
is read with alias expansion and nesting bounded: an 889-byte config of nested aliases under `run.point` hung
training at full CPU while it held run.lock; now it is one line, exit 2, before anything is written. A `base:`
that is a loop of links is one line too. Budget: about 5 s (one `rrtrain train` start)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from prep_helpers import write_id_dataset
from rrtrain.config import load_config
from rrtrain.config_load import parse_override, read_yaml
from rrtrain.core.errors import UsageError
from rrtrain.rundir import readers
from trainutil import REPO, TINY, env, run_cmd


def bomb(levels: int = 9, width: int = 9) -> str:
    """Nested aliases: `width ** levels` values from a few hundred bytes."""
    lines = ["    a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "run:\n  point:\n" + "\n".join(lines) + "\n"


def test_the_alias_bomb_is_small_and_expands_beyond_any_config():
    assert len(bomb()) < 900 and 9**9 > 1e8


def test_training_on_an_alias_bomb_is_one_line_and_writes_nothing(tmp_path):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(f"base: {TINY}\n" + bomb())
    write_id_dataset(tmp_path / "data", 40)
    run = tmp_path / "run"
    res = run_cmd([sys.executable, "-m", "rrtrain.train", str(cfg), f"data.path={tmp_path / 'data'}",
                  f"run.dir={run}", "train.max_steps=1"], env(), timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "expands to more than 100,000 values" in res.stderr
    assert not run.exists()


@pytest.mark.parametrize("where", ["config", "base", "sweep"])
def test_every_yaml_a_user_gives_is_bounded(tmp_path, where):
    body = bomb()
    if where == "base":
        (tmp_path / "inner.yaml").write_text(body)
        body = "base: inner.yaml\n"
    elif where == "sweep":
        body = "name: s\nconfig: ../train/tiny.yaml\nvariants: [review]\noverrides:\n" + bomb().replace("\n", "\n  ")
    (tmp_path / "c.yaml").write_text(body)
    with pytest.raises(UsageError, match="expands to more than 100,000 values, each alias counted at every use"):
        if where == "sweep":
            from launchers.sweep import spec

            spec.load(tmp_path / "c.yaml")
        else:
            read_yaml(tmp_path / "c.yaml")


@pytest.mark.parametrize("text,why", [("a: &a [1, *a]\n", "inside its own anchor"),
                                      ("a: " + "[" * 100 + "]" * 100 + "\n", r"nested too deeply \(more than 64 levels\)")],
                         ids=["contains-itself", "too-deep"])
def test_structures_that_contain_themselves_or_nest_too_deep(tmp_path, text, why):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(UsageError, match=why):
        read_yaml(tmp_path / "c.yaml")


def test_a_run_config_and_an_override_are_bounded(tmp_path):
    from rrtrain.core.files import load_yaml

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(bomb())
    problems: list[str] = []
    assert readers.read_config(run, problems) == {} and problems == ["config.yaml unreadable: ValueError"]
    key, value = parse_override("run.point=" + "{a: &a [x, x, x, x, x, x, x, x, x, x], "
                                + ", ".join(f"b{i}: &b{i} [*{'a' if i == 0 else f'b{i - 1}'}] " for i in range(3)) + "}")
    assert key == ["run", "point"] and isinstance(value, dict)  # small: read as YAML
    flow = "{" + ", ".join(line.strip() for line in bomb().splitlines()[2:]) + "}"
    with pytest.raises(ValueError, match="expands to more than"):
        load_yaml(flow)
    key, value = parse_override("run.point=" + flow)
    assert value == flow  # too large to be YAML: kept as the text it is (the config's checks then refuse it)


def test_base_that_is_a_loop_of_links_is_one_line(tmp_path):
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    (tmp_path / "c.yaml").write_text("base: l1\n")
    with pytest.raises(UsageError, match=r"base: 'l1' cannot be resolved \(a loop of symbolic links\?\)"):
        load_config(tmp_path / "c.yaml")


def test_the_project_configs_read_as_plain_yaml_reads_them():
    from rrtrain.core.files import load_yaml

    files = sorted((REPO / "configs").rglob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        assert load_yaml(path.read_text()) == yaml.safe_load(path.read_text()), path
    assert load_yaml("a: &x {b: 1}\nc: *x\nd: {<<: *x, e: 2}\n") == {"a": {"b": 1}, "c": {"b": 1}, "d": {"b": 1, "e": 2}}

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


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")
def test_libyaml_composes_what_is_within_the_bounds_and_the_python_composer_refuses_the_rest(monkeypatch):
    """libyaml parses and composes (ten times faster than PyYAML's own composer: `rrtrain status` reads every
    run's config); the graph is measured against the bounds once, before anything is constructed, and what is
    outside them is refused by the Python composer in its own words."""
    from rrtrain.core import files

    measured = []
    within = files._within_bounds
    monkeypatch.setattr(files, "_within_bounds", lambda node, *bounds: measured.append(node) or within(node, *bounds))
    text = Path(TINY).read_text()
    assert files.load_yaml(text) == yaml.safe_load(text)
    assert len(measured) == 1 and isinstance(measured[0], yaml.MappingNode)
    for bad, why in [(bomb(), "expands to more than 100,000 values"), ("a: &a [1, *a]\n", "inside its own anchor"),
                     ("a: " + "[" * 100 + "]" * 100 + "\n", "nested too deeply")]:
        with pytest.raises(ValueError, match=why):
            files.load_yaml(bad)
    assert len(measured) == 4
    assert files.load_yaml_tagged("fn: !function utils.f\nn: 1\n", ["!function"]) == {"fn": ("!function", "utils.f"), "n": 1}
    with pytest.raises(yaml.YAMLError):  # a tag not admitted: refused by the Python loader too
        files.load_yaml_tagged("fn: !python/object:os.system ls\n", ["!function"])


@pytest.mark.parametrize("text", ["a: \ud800\n", "a: \x00\n", "a: \x85b\n", "\ufeffa: 1\n", "a: 1\n---\nb: 2\n", "",
                                  "# only\n", "a: !!binary aGk=\n", "a: !!python/name:os.system\n", "a: [1, 2\n",
                                  "x: 2001-12-14t21:59:43.10-05:00\n", "a: &x {b: 1}\nc: *x\nd: {<<: *x, e: 2}\n",
                                  "a: *nowhere\n", "? [a, b]\n: 1\n"])
def test_libyaml_and_the_python_composer_read_alike(text):
    """What either reads, the other reads the same; what either refuses, the other refuses with the same error."""
    from rrtrain.core import files

    def outcome(load):
        try:
            return "value", load()
        except Exception as err:  # noqa: BLE001 - the kind and words of the refusal are what is compared
            return type(err).__name__, str(err)

    assert outcome(lambda: files.load_yaml(text)) == \
        outcome(lambda: yaml.load(text, Loader=files._bounded_yaml_loader()))  # noqa: S506 - the bounded SafeLoader

"""Configuration: YAML files, `base:` inheritance, `a.b=c` overrides, typed validation, one-line errors.

File-level errors are checked here through `rrtrain.resolve.load` (the message): `load_config` and then the
checks against the residual rules and size presets; `test_cli.py` checks that the same kind of error reaches
the user as one line on stderr with exit status 2.
"""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from pathlib import Path

import pytest
import yaml

from rrtrain.config import Config, ModelConfig, load_config
from rrtrain.config_load import apply_overrides, build, parse_override
from rrtrain.core.errors import UsageError
from rrtrain.resolve import load, with_knobs
from trainutil import REPO



def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error(path, overrides=()) -> str:
    with pytest.raises(UsageError) as err:
        load(path, list(overrides))
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ---------------------------------------------------------------------------------------------
# Malformed configurations: each message names the key and says what is wrong


def test_unknown_key_in_file_suggests_closest(tmp_path):
    path = write(tmp_path, "c.yaml", """
        model:
          d_modle: 64
    """)
    assert error(path).startswith("unknown key 'model.d_modle'; did you mean 'model.d_model'? (valid here: size, ")


def test_unknown_section_suggests_closest(tmp_path):
    path = write(tmp_path, "c.yaml", "trian:\n  lr: 0.1\n")
    assert error(path) == \
        "unknown key 'trian'; did you mean 'train'? (valid here: run, model, match, data, train, parallel, monitor, log, eval, init)"


def test_unknown_nested_key_suggests_full_path():
    assert error(None, ["model.variant=review", "model.residual.gate_rnak=4"]) == (
        "unknown key 'model.residual.gate_rnak'; did you mean 'model.residual.gate_rank'? (the knobs of rule "
        "'review': gate_rank, gate_bias)")
    # the knobs are the rule's: standard has none, so the closest is another rule's, said so
    assert error(None, ["model.residual.gate_rnak=4"]).startswith(
        "unknown key 'model.residual.gate_rnak'; did you mean 'model.residual.gate_rank' (a knob of rules 'review', ")
    assert error(None, ["model.variant=review", "model.residual.streams=2"]) == (
        "'model.residual.streams' is a knob of rules 'gr', 'hc', 'mhc', not of 'review' (the knobs of rule "
        "'review': gate_rank, gate_bias)")
    # match.reference's rule is counted with the same section: its knobs are known too
    assert load(None, ["match.reference=review", "model.residual.gate_rank=4"]).model.residual == {"gate_rank": 4}
    assert error(None, ["model.variant=review", "model.residual.gate_rank=x"]) == \
        "model.residual.gate_rank: expected an integer, got 'x'"
    assert error(None, ["model.residual=4"]) == "model.residual: expected a mapping, got 4"


def test_unknown_key_without_close_match_lists_valid():
    msg = error(None, ["train.zzzzzz=1"])
    assert msg.startswith("unknown key 'train.zzzzzz' (valid here: seed, max_steps,") and "did you mean" not in msg


def test_wrong_type_number():
    assert error(None, ["train.lr=abc"]) == "train.lr: expected a number, got 'abc'"
    assert error(None, ["train.lr=true"]) == "train.lr: expected a number, got True"


def test_wrong_type_integer_and_boolean():
    assert error(None, ["train.global_batch=2.5"]) == "train.global_batch: expected an integer, got 2.5"
    assert error(None, ["data.shuffle=maybe"]) == "data.shuffle: expected a boolean (true/false), got 'maybe'"
    assert error(None, ["model.n_heads=[4]"]) == "model.n_heads: expected int or null, got [4]"


def test_d_model_not_divisible_by_heads(tmp_path):
    path = write(tmp_path, "c.yaml", """
        model:
          d_model: 100
          n_heads: 3
    """)
    assert error(path) == "model.d_model=100 is not divisible by model.n_heads=3"


def test_zero_layers():
    assert error(None, ["model.n_layers=0"]) == "model.n_layers must be at least 1, got 0"


def test_negative_learning_rate(tmp_path):
    path = write(tmp_path, "c.yaml", "train:\n  lr: -0.001\n")
    assert error(path) == "train.lr must be positive, got -0.001"


def test_unknown_variant_suggests_closest():
    assert error(None, ["model.variant=reviw"]).startswith(
        "model.variant: unknown residual rule 'reviw' (did you mean 'review'?); known: standard, review,")
    assert error(None, ["match.reference=highwya"]).startswith(
        "match.reference: unknown residual rule 'highwya' (did you mean 'highway'?)")


def test_unknown_size_suggests_closest():
    message = error(None, ["model.size=rr-1bn"])
    assert message.startswith("model.size: unknown preset 'rr-1bn' (did you mean 'rr-1b'?); known: ")
    assert "tiny, tiny-deep, rr-60m, rr-150m" in message  # every preset, in size order


def test_malformed_yaml_gives_the_line(tmp_path):
    path = write(tmp_path, "c.yaml", """\
        model:
          size: tiny
        train:
          lr: 0.1
          seed: [1
          max_steps: 3
    """)
    msg = error(path)
    assert msg.startswith(f"{path} line 6: not valid YAML (")  # PyYAML notices at the next line


def test_yaml_that_is_not_a_mapping(tmp_path):
    assert error(write(tmp_path, "l.yaml", "- a\n- b\n")).endswith(": expected a mapping at the top level, got list")
    assert error(write(tmp_path, "s.yaml", "model: 5\n")) == "model: expected a mapping of keys, got 5"


def test_missing_file(tmp_path):
    assert error(tmp_path / "nope.yaml") == f"cannot read config {tmp_path / 'nope.yaml'}: No such file or directory"


def test_override_without_equals():
    assert error(None, ["train.lr"]) == "override 'train.lr' is not of the form key.sub=value"
    assert error(None, ["=3"]) == "override '=3' has an empty key"
    assert error(None, ["train..lr=3"]) == "override 'train..lr=3' has an empty key"


def test_bad_literal_suggests_closest():
    assert error(None, ["parallel.backend=fsdpp"]) == \
        "parallel.backend: expected one of 'none', 'fsdp', 'deepspeed', got 'fsdpp' (did you mean 'fsdp'?)"
    assert error(None, ["model.pos=rotary"]).startswith("model.pos: expected one of 'learned', 'rope', got 'rotary'")


@pytest.mark.parametrize("override,message", [
    ("train.beta2=1.0", "train.beta2 must be in [0, 1), got 1.0"),
    ("parallel.zero_stage=4", "parallel.zero_stage must be 1, 2 or 3, got 4"),
    ("train.max_steps=0", "train.max_steps must be at least 1, got 0"),
    ("train.min_lr_ratio=1.5", "train.min_lr_ratio must be in [0, 1], got 1.5"),
    ("train.weight_decay=-0.1", "train.weight_decay must not be negative, got -0.1"),
    ("model.variant=review model.residual.gate_rank=-1", "model.residual.gate_rank must not be negative, got -1"),
    ("model.variant=mhc model.residual.streams=0", "model.residual.streams must be positive, got 0"),
    ("train.micro_batch=0", "train.micro_batch must be positive, got 0"),
    ("model.pos=rope", None),  # fine: tiny's head size is even
])
def test_range_checks(override, message):
    if message is None:
        load(None, override.split())
    else:
        assert error(None, override.split()) == message


def test_async_checkpoints_are_for_dcp_backends():
    assert error(None, ["train.ckpt_async=true", "parallel.backend=deepspeed"]) == \
        "train.ckpt_async=true needs parallel.backend=fsdp or none (DeepSpeed writes its own checkpoints synchronously)"
    assert error(None, ["train.ckpt_async=3"]) == "train.ckpt_async: expected a boolean (true/false), got 3"
    assert load_config(None, ["train.ckpt_async=true", "parallel.backend=fsdp"]).train.ckpt_async is True
    assert load_config(None).train.ckpt_async is False


# ---------------------------------------------------------------------------------------------
# What valid input does


def test_defaults():
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.model.size == "tiny" and cfg.model.variant == "standard" and cfg.train.lr == 3e-4
    assert cfg.parallel.backend == "none" and cfg.match.widen == "mlp" and cfg.model.residual == {}


def test_overrides_parse_yaml_values():
    cfg = load_config(None, ["train.lr=1e-3", "train.max_steps=1e3", "model.d_ff=null", "data.shuffle=false",
                             "train.tokens=1_000_000", "run.name=abc", "model.residual.gate_bias=-2"])
    assert cfg.train.lr == 0.001 and cfg.train.max_steps == 1000 and cfg.model.d_ff is None
    assert cfg.data.shuffle is False and cfg.train.tokens == 1_000_000 and cfg.run.name == "abc"
    assert cfg.model.residual == {"gate_bias": -2}  # a plain mapping here: its rule types it
    typed = with_knobs(load_config(None, ["model.variant=highway", "model.residual.gate_bias=-2"])).model.residual
    assert typed == {"gate_rank": 0, "gate_bias": -2.0} and isinstance(typed["gate_bias"], float)


def test_base_inheritance_and_override_order(tmp_path):
    write(tmp_path, "root.yaml", """
        model:
          size: rr-60m
          variant: highway
          residual:
            gate_rank: 8
        train:
          lr: 0.01
          seed: 1
    """)
    (tmp_path / "sub").mkdir()
    write(tmp_path, "sub/mid.yaml", """
        base: ../root.yaml
        train:
          lr: 0.02
    """)
    leaf = write(tmp_path, "sub/leaf.yaml", """
        base: mid.yaml
        model:
          variant: review
    """)
    cfg = load_config(leaf, ["train.seed=7"])
    assert cfg.model.size == "rr-60m"  # from the root, through two levels
    assert cfg.model.variant == "review"  # the leaf wins over its base
    assert cfg.model.residual == {"gate_rank": 8}  # nested mappings merge key by key
    assert cfg.train.lr == 0.02  # the middle file wins over the root
    assert cfg.train.seed == 7  # the command line wins over every file


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.variant=review", "train.lr=0.002", "parallel.precision=bf16"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert load_config(path) == cfg


def test_build_and_overrides_helpers():
    assert parse_override("a.b.c= 3") == (["a", "b", "c"], 3)
    assert parse_override("a=x=y") == (["a"], "x=y")
    assert apply_overrides({"a": {"b": 1, "c": 2}}, ["a.b=5"]) == {"a": {"b": 5, "c": 2}}
    assert build(ModelConfig, {"size": "rr-1b", "residual": {"streams": 2}}).residual == {"streams": 2}
    # the dataclass defaults are what every doc table lists
    assert dataclasses.fields(Config)[0].name == "run"


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "train").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_training_configs_load(path):
    cfg = load(path)
    assert cfg.model.size


def _keys(cls, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name[:-1] if f.name.endswith('_') else f.name}"  # `init.from` is the field from_


def test_every_key_is_documented():
    """docs/configuration.md lists every configuration key (add a row when you add a field)."""
    doc = (REPO / "docs" / "configuration.md").read_text()
    missing = [key for key in _keys(Config) if f"| `{key}` |" not in doc]
    assert not missing, f"keys missing from docs/configuration.md: {missing}"

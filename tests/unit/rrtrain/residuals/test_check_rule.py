"""The rule registry's extension points and `rrtrain check-rule`: knobs brought by rules, rules discovered
from entry points (a broken one skipped with a warning), and the in-process generic checks failing on rules
that break them (a wrong count, an unused parameter, a graph break). tests/e2e/test_external_rule.py installs
a real package and runs every check on it. Runtime: a few seconds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rrtrain import residuals
from rrtrain.cli.main import main as cli_main
from rrtrain.cli.rule_checks import RuleUnderCheck, run_check
from rrtrain.config import Config
from rrtrain.config_load import build
from rrtrain.core.errors import UsageError
from rrtrain.residuals import RuleKnobs, RuleSpec, require
from rrtrain.resolve import check_model, with_knobs
from rrtrain.residuals.single import PreNormSite, SingleStream
from rrtrain.residuals.streams import StreamKnobs


@pytest.fixture
def scratch_registry(monkeypatch):
    """Rules registered inside a test are gone after it (their knobs with them: nothing else holds them)."""
    monkeypatch.setattr(residuals, "_RULES", dict(residuals._RULES))


@dataclass
class ToyKnobs:
    toy_scale: float = 1.0  # the toy rule's factor on u

    def check(self) -> None:
        require(self, positive=("toy_scale",))


class ToySite(PreNormSite):
    def write(self, state, y, ctx):
        return state + self.info.cfg.toy_scale * y


class MiscountedSite(PreNormSite):
    @classmethod
    def count(cls, d, cfg):
        return d + 1


class UnusedParameterSite(PreNormSite):
    def __init__(self, info):
        super().__init__(info)
        self.forgotten = torch.nn.Parameter(torch.zeros(3))

    @classmethod
    def count(cls, d, cfg):
        return d + 3


class GlobalDrawSite(PreNormSite):
    """Draws its init from torch's global generator instead of the unit's."""

    def __init__(self, info):
        super().__init__(info)
        self.w = torch.nn.Parameter(torch.empty(info.d_model))

    @classmethod
    def count(cls, d, cfg):
        return 2 * d

    def write(self, state, y, ctx):
        return state + self.w * y

    def reset_parameters(self, generator=None):
        super().reset_parameters(generator)
        torch.nn.init.normal_(self.w)


class GraphBreakSite(PreNormSite):
    def write(self, state, y, ctx):
        torch._dynamo.graph_break()
        return state + y


def toy(name: str, site=ToySite, knobs=(ToyKnobs,)) -> RuleSpec:
    return RuleSpec(name=name, site=site, stream=SingleStream, knobs=knobs, summary="a toy")


def check(name: str, which: str, **knobs):
    rule = residuals._RULES.get(name)
    values = rule.make_knobs(**knobs) if rule is not None else RuleKnobs()
    return run_check(which, RuleUnderCheck(name, values, None, Path("/nonexistent")))


def config(variant: str, **residual) -> Config:
    return build(Config, {"model": {"variant": variant, "residual": residual}})


def test_a_rule_brings_its_knobs_into_model_residual(scratch_registry):
    with pytest.raises(UsageError, match="model.variant: unknown residual rule '_toy'"):
        check_model(config("_toy", toy_scale=2))
    residuals.register(toy("_toy"))
    residual = with_knobs(config("_toy", toy_scale=2)).model.residual
    assert residual == {"toy_scale": 2.0} and isinstance(residual["toy_scale"], float)  # typed as the knob
    assert with_knobs(config("_toy")).model.residual == {"toy_scale": 1.0}  # written out in full
    assert dataclasses.asdict(with_knobs(config("_toy", toy_scale=2)))["model"]["residual"] == {"toy_scale": 2.0}
    with pytest.raises(UsageError, match="did you mean 'model.residual.toy_scale'"):
        check_model(config("_toy", toy_scal=2))
    with pytest.raises(UsageError, match=r"^model.residual.toy_scale must be positive, got 0.0$"):
        check_model(config("_toy", toy_scale=0))
    with pytest.raises(UsageError, match="model.residual.toy_scale' is a knob of rule '_toy', not of 'review'"):
        check_model(config("review", toy_scale=2))  # another rule's knob is refused, naming whose it is
    residuals.register(toy("_toy_two", knobs=(ToyKnobs, StreamKnobs)))  # a shared knob class is listed again
    assert with_knobs(config("_toy_two")).model.residual == {"toy_scale": 1.0, "streams": 4}


def test_a_knob_key_belongs_to_one_class_of_its_rule(scratch_registry):
    @dataclass
    class Rival:
        streams: int = 2

    with pytest.raises(ValueError, match=r"model.residual.streams is declared by both StreamKnobs and .*Rival"):
        toy("_rival", knobs=(StreamKnobs, Rival))
    residuals.register(toy("_rival", knobs=(Rival,)))  # another rule may have a knob of that name: its own
    assert with_knobs(config("_rival")).model.residual == {"streams": 2}
    assert with_knobs(config("mhc")).model.residual["streams"] == 4

    @dataclass
    class Bad:
        values: int = 1  # would hide RuleKnobs.values

    @dataclass
    class NoDefault:
        toy_width: int

    with pytest.raises(ValueError, match=r"knob .*Bad.values: the name is taken by RuleKnobs itself"):
        toy("_bad", knobs=(Bad,))
    with pytest.raises(TypeError, match="knob .*NoDefault.toy_width needs a default"):
        toy("_bad", knobs=(NoDefault,))
    with pytest.raises(TypeError, match="must be a dataclass"):
        toy("_bad", knobs=(int,))


def test_rule_knobs_read_as_one_namespace():
    spec = residuals.get("mhc")
    knobs = spec.make_knobs(streams=2)
    assert knobs.streams == 2 and knobs.sinkhorn_iters == spec.make_knobs().sinkhorn_iters
    assert list(knobs.values()) == spec.knob_names() and knobs == spec.make_knobs(streams=2) != spec.make_knobs()
    with pytest.raises(AttributeError, match="model.residual has no knob 'gate_rank' for this rule"):
        knobs.gate_rank
    with pytest.raises(AttributeError, match="read-only"):
        knobs.streams = 3
    with pytest.raises(TypeError, match="unexpected name 'gate_rank'"):
        spec.make_knobs(gate_rank=2)
    with pytest.raises(residuals.KnobError, match="^model.residual.streams must be positive, got 0$"):
        spec.make_knobs(streams=0).check()


class FakeEntryPoint:
    def __init__(self, name, target):
        self.name, self.value, self.target = name, f"fake_pkg:{name}", target

    def load(self):
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def test_discover_registers_installed_rules_and_skips_a_broken_one(scratch_registry, monkeypatch):
    eps = [FakeEntryPoint("_found", toy("_found")), FakeEntryPoint("_broken", ImportError("no module fake_pkg")),
           FakeEntryPoint("_dup", residuals.get("review"))]
    monkeypatch.setattr(residuals, "entry_points", lambda group: eps if group == residuals.ENTRY_POINT_GROUP else [])
    with pytest.warns(UserWarning) as caught:
        assert residuals.discover() == ["_found"]
    messages = [str(w.message) for w in caught]
    assert any("'_broken = fake_pkg:_broken' skipped: ImportError: no module fake_pkg" in m for m in messages)
    assert any("'_dup" in m and "registered twice" in m for m in messages)
    assert residuals.get("_found").params(16, 4, residuals.get("_found").make_knobs()) == 16 + 4 * 16


def test_the_checks_pass_a_sound_rule(scratch_registry):
    residuals.register(toy("_toy"))
    for which in ("sanity", "params", "compile"):
        outcome = check("_toy", which)
        assert outcome.ok, outcome


def test_the_checks_catch_a_broken_rule(scratch_registry):
    for name, site in (("_miscounted", MiscountedSite), ("_unused", UnusedParameterSite),
                       ("_graph_break", GraphBreakSite), ("_global_draw", GlobalDrawSite)):
        residuals.register(toy(name, site=site, knobs=()))
    miscounted = check("_miscounted", "params")
    assert not miscounted.ok and "d=16, 4 sublayers: the spec counts 84 parameters, the modules have 80" \
        in miscounted.detail
    unused = check("_unused", "sanity")
    assert not unused.ok and "parameter blocks.0.attn_site.forgotten gets no gradient" in unused.detail, unused
    assert check("_unused", "params").ok
    global_draw = check("_global_draw", "sanity")
    assert not global_draw.ok and "draws from torch's global generator" in global_draw.detail, global_draw
    broken = check("_graph_break", "compile")
    assert not broken.ok and broken.detail.startswith("dynamo cannot trace the block in one graph"), broken
    assert not check("_toy_missing", "sanity").ok  # an unknown rule is a failed check, not a traceback
    assert not check("review", "resume").ok  # no dataset given


def test_check_rule_command_bad_input(capsys):
    assert cli_main(["check-rule", "reveiw"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown residual rule 'reveiw' (did you mean 'review'?)" in err
    assert cli_main(["check-rule", "review", "--only", "sanity,compiel"]) == 2
    assert "--only: unknown check 'compiel' (did you mean 'compile'?)" in capsys.readouterr().err
    assert cli_main(["check-rule", "mhc", "--set", "residual.streams=0", "--only", "params"]) == 2
    assert "model.residual.streams must be positive, got 0" in capsys.readouterr().err


def test_check_rule_command_runs_the_chosen_checks(capsys):
    assert cli_main(["check-rule", "rezero", "--only", "params,sanity"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ok    params") and lines[1].startswith("ok    sanity")
    assert lines[-1] == "rezero: 2/2 checks passed"

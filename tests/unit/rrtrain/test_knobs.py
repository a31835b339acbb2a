"""`model.residual` against the knobs of the run's rules (rrtrain.knobs, through rrtrain.resolve): the config
holds a plain mapping, the rule brings its own knobs, a resolved run records all of them, and what it records
reads back and resumes as it was written. Run configs written before per-rule knobs (every registered rule's
knobs in every run) still load."""

from __future__ import annotations

import yaml

import pytest

from rrtrain import residuals
from rrtrain.config import Config, load_config
from rrtrain.config_load import build
from rrtrain.core.errors import UsageError
from rrtrain.artifact import read_run_config
from rrtrain.model.spec import ModelSpec
from rrtrain.resolve import build_config, build_model, resolve, with_knobs
from rrtrain.training.checkpoint import check_resume

MANIFEST = {"vocab_size": 64, "seq_len": 16, "fingerprint": "f"}


def config(*overrides: str) -> Config:
    return load_config(None, ["model.n_layers=2", "train.max_steps=4", *overrides])


def test_a_resolved_run_records_every_knob_of_its_rules():
    run = resolve(config("model.variant=mhc", "model.residual.streams=2"), MANIFEST)
    mhc = residuals.get("mhc")
    assert list(run.cfg.model.residual) == mhc.knob_names()
    assert run.cfg.model.residual == {**mhc.make_knobs().values(), "streams": 2} and run.knobs.streams == 2
    # a matched run counts its reference with the same section: the reference's knobs are recorded too
    matched = resolve(config("model.variant=standard", "match.reference=review", "model.residual.gate_rank=4"))
    assert matched.cfg.model.residual == {"gate_rank": 4, "gate_bias": None}
    assert matched.knobs.values() == {}  # standard has none of its own


def test_the_recorded_config_reads_back_and_resumes_as_written(tmp_path):
    run = resolve(config("model.variant=highway", "model.residual.gate_bias=-1"), MANIFEST)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(run.cfg.to_dict(), sort_keys=False))
    again = resolve(load_config(path), MANIFEST)
    assert again.cfg == run.cfg and again.knobs == run.knobs
    assert check_resume(run.cfg.to_dict(), again.cfg.to_dict(), 1, 1, allow=False) == []
    # the same run given its defaults explicitly, or not at all, records the same section
    explicit = resolve(config("model.variant=highway", "model.residual.gate_bias=-1.0", "model.residual.gate_rank=0"),
                       MANIFEST)
    assert check_resume(run.cfg.to_dict(), explicit.cfg.to_dict(), 1, 1, allow=False) == []
    # a changed knob is a changed model: never resumed, even with consent
    changed = resolve(config("model.variant=highway", "model.residual.gate_bias=-2"), MANIFEST)
    with pytest.raises(UsageError, match=r"cannot resume.*model.residual.gate_bias: -1.0 -> -2.0"):
        check_resume(run.cfg.to_dict(), changed.cfg.to_dict(), 1, 1, allow=True)


def test_the_model_is_built_from_its_spec_alone():
    run = resolve(config("model.variant=gr", "model.residual.gr_rank=3"), MANIFEST)
    spec = run.model_spec
    assert spec.rule is run.rule and spec.knobs.gr_rank == 3 and spec.shape == run.shape
    model = build_model(run.cfg.model, shape=run.shape, rule=run.rule, device="meta")
    assert model.spec == spec and sum(p.numel() for p in model.parameters()) == run.params
    # what an export writes into config.json and builds the model from, without the registry
    again = ModelSpec.from_dict(spec.to_dict(), residuals.BUILTIN)
    assert again == spec and again.to_dict()["residual"]["gr_rank"] == 3
    with pytest.raises(ValueError, match="'gr' is not among the rules at hand"):
        ModelSpec.from_dict(spec.to_dict(), [residuals.get("review")])


def test_a_sweep_grid_types_a_rules_knob_before_its_runs_have_a_variant():
    """launchers.sweep.expand types grid values through `build_config` with the base config's variant."""
    cfg = build_config({"model": {"residual": {"gate_bias": -1, "streams": "2", "no_such": 3}}})
    assert cfg.model.residual == {"gate_bias": -1.0, "streams": 2, "no_such": 3}  # the unknown key: for check_model
    assert isinstance(cfg.model.residual["gate_bias"], float)
    with pytest.raises(UsageError, match="model.residual.streams: expected an integer, got 'x'"):
        build_config({"model": {"residual": {"streams": "x"}}})
    assert build(Config, {"model": {"residual": {"gate_bias": -1}}}).model.residual == {"gate_bias": -1}


def write_run(tmp_path, residual: dict, variant: str = "review"):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"variant": variant, "n_layers": 2,
                                                               "residual": residual}}))
    return run


def test_a_run_recorded_with_every_rules_knobs_still_loads(tmp_path):
    """rrtrain before per-rule knobs wrote every registered rule's knobs into each run's config.yaml."""
    everything = {}
    for name in residuals.names():
        everything.update(residuals.get(name).make_knobs().values())
    everything["gate_rank"] = 4
    cfg = read_run_config(write_run(tmp_path, everything))
    assert cfg.model.residual == {"gate_rank": 4, "gate_bias": None}


def test_a_recorded_key_no_rule_has_is_still_refused(tmp_path):
    with pytest.raises(UsageError, match=r"config.yaml does not validate: unknown key 'model.residual.gate_rnak'; "
                                         r"did you mean 'model.residual.gate_rank'\?"):
        read_run_config(write_run(tmp_path, {"gate_rnak": 4}))


def test_with_knobs_refuses_what_the_rules_refuse():
    with pytest.raises(UsageError, match=r"^'model.residual.gr_rank' is a knob of rule 'gr', not of 'hc'"):
        with_knobs(config("model.variant=hc", "model.residual.gr_rank=2"))
    with pytest.raises(UsageError, match=r"^model.residual.fixup_variant: expected one of 'fixup', 'tfixup', "
                                         r"got 'tfix' \(did you mean 'tfixup'\?\)$"):
        with_knobs(config("model.variant=fixup", "model.residual.fixup_variant=tfix"))
    with pytest.raises(UsageError, match=r"^model.residual.sinkhorn_iters must be positive, got 0$"):
        with_knobs(config("model.variant=mhc", "model.residual.sinkhorn_iters=0"))

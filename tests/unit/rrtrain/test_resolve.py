"""The resolved run (`rrtrain.resolve`): one frozen object per config, the registry asked once on the way to the block.

What every consumer reads (the rule's spec, shape, counts, budget, manifest) is worked out in `resolve`; the
model, the counts and the engine take the spec, so building a model from a resolved run asks the registry
nothing more. The step budget is computed in `rrtrain.budget`, which loads no torch (`rrtrain status`).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from rrtrain import budget, residuals, sizing
from rrtrain.config import Config, ModelConfig, TrainConfig
from rrtrain.core.errors import UsageError
from rrtrain.resolve import ResolvedRun, build_model, resolve
from trainutil import PY, REPO, env

MANIFEST = {"vocab_size": 300, "seq_len": 32, "fingerprint": "f"}


def counting_lookups(monkeypatch) -> list[str]:
    """Every name `residuals.get` is asked for from now on."""
    asked: list[str] = []
    real = residuals.get

    def get(name: str):
        asked.append(name)
        return real(name)

    monkeypatch.setattr(residuals, "get", get)
    return asked


def tiny(variant: str = "review", **train) -> Config:
    return Config(model=ModelConfig(size="tiny", variant=variant, n_layers=2), train=TrainConfig(**train))


def test_the_registry_is_asked_once_per_resolution_and_not_by_the_model(monkeypatch):
    asked = counting_lookups(monkeypatch)
    run = resolve(tiny(max_steps=10), MANIFEST)
    model = build_model(run.cfg.model, shape=run.shape, rule=run.rule, device="meta")
    assert asked == ["review"]
    assert model.rule is run.rule and model.shape == run.shape
    assert sum(p.numel() for p in model.parameters()) == run.params


def test_a_matched_run_asks_for_its_reference_once_more(monkeypatch):
    asked = counting_lookups(monkeypatch)
    cfg = tiny("standard", max_steps=10)
    cfg.match.reference = "review"
    run = resolve(cfg)
    assert sorted(asked) == ["review", "standard"]
    target = sizing.count_params(sizing.resolve_shape(cfg.model), "review", cfg.model.residual)
    assert abs(run.params - target) <= cfg.match.tolerance * target and run.shape.d_ff > 256


def test_the_resolved_run_is_frozen():
    run = resolve(tiny(max_steps=10))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.shape = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.budget.total_steps = 3
    assert isinstance(run, ResolvedRun)


def test_it_holds_the_figures_the_consumers_read():
    run = resolve(tiny(tokens=32 * 8 * 50 + 7, global_batch=8), MANIFEST)
    assert (run.shape.vocab_size, run.shape.seq_len) == (300, 32)  # the dataset's, over the preset's
    assert run.params == sizing.count_params(run.shape, run.rule, run.cfg.model.residual)
    assert run.flops_per_token == sizing.flops_per_token(run.shape, run.rule, run.cfg.model.residual)
    assert (run.budget.tokens_per_step, run.total_steps, run.warmup_steps) == (256, 50, 2)
    assert run.tokens == 32 * 8 * 50 + 7 and run.manifest is MANIFEST
    assert resolve(tiny()).budget is None  # no budget set: bench and plan need none


def test_dataset_conflicts_are_one_line():
    with pytest.raises(UsageError, match="does not fit the model's vocab_size 64"):
        resolve(Config(model=ModelConfig(size="tiny", vocab_size=64)), MANIFEST)
    with pytest.raises(UsageError, match="model.seq_len=16 but the dataset was packed with seq_len=32"):
        resolve(Config(model=ModelConfig(size="tiny", seq_len=16)), MANIFEST)
    with pytest.raises(UsageError, match="model.variant: unknown residual rule 'reviw'"):
        resolve(tiny("reviw"))


def test_budget_is_the_trainers_formula():
    assert budget.total_steps(5, 10**9, 100) == 5  # max_steps wins
    assert budget.total_steps(None, 1000, 300) == 3 and budget.total_steps(None, 10, 300) == 1
    assert budget.total_steps(None, None, 300) is None
    assert budget.warmup_steps(None, 100) == 5 and budget.warmup_steps(None, 3) == 1 and budget.warmup_steps(7, 3) == 7
    with pytest.raises(UsageError, match=r"set train.max_steps or train.tokens \(the run's budget\)"):
        budget.require(budget.budget(TrainConfig(), 32))


def test_budget_and_the_manifest_reader_load_no_torch():
    code = ("import json, sys, rrtrain.budget, rrtrain.data.manifest, rrtrain.sizing as s; s.presets(); "
            "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch" not in set(json.loads(proc.stdout))

"""Which configuration changes a resume accepts, refuses, or refuses whatever the user says."""

from __future__ import annotations

import pytest

from rrtrain.training.checkpoint import check_resume
from rrtrain.config import Config
from rrtrain.core.errors import UsageError


def cfg(**changes) -> dict:
    d = Config().to_dict()
    for key, value in changes.items():
        section, name = key.split("__")
        d[section][name] = value
    return d


def test_same_config_resumes_silently():
    assert check_resume(cfg(), cfg(), 2, 2, allow=False) == []


def test_cadence_changes_are_free():
    assert check_resume(cfg(), cfg(train__log_every=3, train__ckpt_every=7, parallel__ac="full"), 1, 1, False) == []
    assert check_resume(cfg(), cfg(train__ckpt_async=True), 1, 1, False) == []  # how checkpoints are written


@pytest.mark.parametrize("change", [{"train__global_batch": 16}, {"train__lr": 1e-3}, {"parallel__precision": "bf16"}])
def test_trajectory_changes_need_consent(change):
    with pytest.raises(UsageError, match="allow_config_change"):
        check_resume(cfg(), cfg(**change), 1, 1, allow=False)
    accepted = check_resume(cfg(), cfg(**change), 1, 1, allow=True)
    assert len(accepted) == 1


def test_layout_change_is_accepted_without_consent_and_listed():
    fsdp = cfg(parallel__backend="fsdp")
    hsdp = cfg(parallel__backend="fsdp", parallel__dp_shard=2, parallel__dp_replicate=2)
    assert check_resume(fsdp, fsdp, 2, 4, allow=False) == ["world_size: 2 -> 4"]
    assert check_resume(fsdp, hsdp, 4, 4, allow=False) == ["parallel.dp_replicate: None -> 2",
                                                           "parallel.dp_shard: None -> 2"]


def test_layout_change_does_not_hide_a_change_that_needs_consent():
    with pytest.raises(UsageError, match=r"\(train.global_batch: 8 -> 16\);"):
        check_resume(cfg(), cfg(train__global_batch=16), 2, 4, allow=False)
    assert check_resume(cfg(), cfg(train__global_batch=16), 2, 4, allow=True) == ["train.global_batch: 8 -> 16",
                                                                                 "world_size: 2 -> 4"]


@pytest.mark.parametrize("change", [{"model__d_model": 96}, {"model__variant": "review"}, {"data__path": "/other"},
                                    {"train__seed": 7}])
def test_model_and_data_changes_are_refused_even_with_consent(change):
    with pytest.raises(UsageError, match="use a new run.dir"):
        check_resume(cfg(), cfg(**change), 1, 1, allow=True)


def test_a_checkpoint_that_recorded_every_rules_knobs_resumes():
    """rrtrain before per-rule knobs wrote every registered rule's knobs into a run's config: such a checkpoint
    resumes, while a knob of the run's own rule that differs, or a key no rule has, is still a model change."""
    from rrtrain.resolve import build_config, with_knobs

    current = with_knobs(build_config({"model": {"size": "micro", "variant": "review"}})).to_dict()
    old = {**current, "model": {**current["model"], "residual": {**current["model"]["residual"], "streams": 4,
                                                                "fixup_variant": "tfixup"}}}
    assert check_resume(old, current, 1, 1, allow=False) == []
    for stray in ({"no_rule_has_this": 1}, {next(iter(current["model"]["residual"])): "changed"}):
        bad = {**old, "model": {**old["model"], "residual": {**old["model"]["residual"], **stray}}}
        with pytest.raises(UsageError, match="cannot resume"):
            check_resume(bad, current, 1, 1, allow=False)


def test_a_checkpoint_older_than_a_setting_resumes_while_the_setting_keeps_its_default():
    saved = cfg()
    del saved["model"]["doc_mask"], saved["model"]["parametrization"], saved["data"]["sources"]
    assert check_resume(saved, cfg(), 1, 1, allow=False) == []
    with pytest.raises(UsageError, match="model.doc_mask: None -> True"):  # a setting the old run did not have
        check_resume(saved, cfg(model__doc_mask=True), 1, 1, allow=False)

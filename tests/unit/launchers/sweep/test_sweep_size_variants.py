"""`sizes.<size>.variants`: the residual rules run at one size instead of the sweep's `variants` (the demo runs
only review and review_convex at 40 sublayers). Expansion only, no training: well under a second."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from launchers.sweep import spec
from launchers.sweep.expand import data_path, expand
from rrtrain import sizing
from rrtrain.config import ModelConfig
from rrtrain.core.errors import UsageError
from trainutil import REPO

BASE = {"config": "tiny.yaml", "data": "/data/stories", "variants": ["review", "highway", "standard"],
        "match": "review", "sizes": {"tiny": {"seeds": 2, "overrides": {"train.max_steps": 5}},
                                     "tiny-deep": {"seeds": 1, "variants": ["review", "review_convex"],
                                                   "overrides": {"train.max_steps": 5}}}}


def load(tmp_path: Path, body: dict) -> spec.Sweep:
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(body))
    return spec.load(p)


def test_a_size_runs_its_own_variants(tmp_path):
    sweep = load(tmp_path, BASE)
    runs = expand(sweep, tmp_path / "out", data_path(sweep, tmp_path / "out"))
    by_size = {s: sorted(r.variant for r in runs if r.size == s) for s in ("tiny", "tiny-deep")}
    assert by_size == {"tiny": ["highway", "highway", "review", "review", "standard", "standard"],
                       "tiny-deep": ["review", "review_convex"]}
    convex = next(r for r in runs if r.variant == "review_convex")
    assert convex.id == "tiny-deep-review_convex-s0"
    assert sizing.resolve_shape(ModelConfig(size=convex.config["model"]["size"])).n_sublayers == 40
    assert convex.config["match"]["reference"] == "review"


@pytest.mark.parametrize("variants,message", [
    (["review", "reviw_convex"], "sizes.tiny-deep.variants: unknown residual rule 'reviw_convex' "
                                 "(did you mean 'review_convex'?)"),
    (["review", "review"], "must list each residual rule once"),
    ([], "must list each residual rule once"),
])
def test_bad_size_variants_refused(tmp_path, variants, message):
    body = {**BASE, "sizes": {**BASE["sizes"], "tiny-deep": {**BASE["sizes"]["tiny-deep"], "variants": variants}}}
    with pytest.raises(UsageError, match=re.escape(message)):
        load(tmp_path, body)


def test_a_run_entry_of_another_size_variant_is_refused(tmp_path):
    body = {**BASE, "runs": {"tiny-review_convex-s0": {"train.max_steps": 3}}}
    with pytest.raises(UsageError, match="no run 'tiny-review_convex-s0'"):
        sweep = load(tmp_path, body)
        expand(sweep, tmp_path / "out", data_path(sweep, tmp_path / "out"))


def test_the_demo_sweep(tmp_path):
    """configs/sweeps/demo.yaml: 3 variants x 2 sizes x 2 seeds, plus review and review_convex at 40 sublayers."""
    sweep = spec.load(REPO / "configs" / "sweeps" / "demo.yaml")
    runs = expand(sweep, tmp_path / "out", data_path(sweep, tmp_path / "out"))
    assert len(runs) == 14
    deep = {r.variant: r for r in runs if r.size == "tiny-deep"}
    assert sorted(deep) == ["review", "review_convex"]
    # the plateau test early and stopping only at 40 sublayers: at the small sizes a healthy run can stay on
    # the unigram plateau past step 90 (README), so they keep the monitor's defaults
    assert all(r.config["monitor"]["on_stall"] == "stop" and r.config["monitor"]["min_steps"] == 90
               for r in deep.values())
    assert all(r.config["monitor"]["on_stall"] == "flag" and r.config["monitor"]["min_steps"] == 200
               for r in runs if r.size != "tiny-deep")

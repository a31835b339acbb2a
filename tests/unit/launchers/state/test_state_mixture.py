"""What the sweep side reads of a run that trains on a mixture (`data.sources`): the step budget from the
sources' shared seq_len, and the stall test's entropy floor weighted as the trainer's monitor weights it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from launchers.state.flags import _entropy_and_warmup
from launchers.state.runstate import total_steps
from rrtrain.rundir import fields


def dataset(tmp_path: Path, name: str, entropy: float, seq_len: int = 32) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"unigram_entropy": entropy, "seq_len": seq_len}))
    return str(d)


def run_with(tmp_path: Path, data: dict) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    config = {"data": data, "train": {"tokens": 3200, "global_batch": 4, "warmup_steps": 3}, "model": {}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def test_a_mixture_floor_is_its_sources_entropies_weighted_and_its_budget_their_seq_len(tmp_path):
    a, b = dataset(tmp_path, "a", 2.0), dataset(tmp_path, "b", 5.0)
    run = run_with(tmp_path, {"path": None, "sources": [{"path": a, "weight": 3}, {"path": b, "weight": 1}]})
    assert _entropy_and_warmup(run) == (2.75, 3)
    assert total_steps(yaml.safe_load((run / "config.yaml").read_text())) == 3200 // (4 * 32)


def test_one_source_and_unusable_mixtures():
    assert fields.data_sources({"data": {"path": "/d"}}) == [("/d", 1.0)]
    assert fields.data_sources({"data": {"sources": [{"path": "/a", "weight": 1}, {"path": "/b"}]}}) == []
    assert fields.data_sources({"data": {"sources": [{"path": "/a", "weight": -1}]}}) == []
    assert fields.data_sources({"data": {"sources": "/a"}}) == [] and fields.data_sources([]) == []

"""`rrtrain plan SWEEP.yaml`: every run of a sweep, as `launchers.sweep.expand` resolves it, planned and summed.

Runtime: a few seconds (fake-tensor traces of rr-60m and rr-150m).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rrtrain.cli.main import main
from rrtrain.config import ModelConfig
from rrtrain.parallel.memory import Setup, plan

SWEEP = """
name: plan-test
config: tiny.yaml
data: data
variants: [review, standard]
match: review
sizes:
  rr-60m: {seeds: 2, tokens: 1000000000}
  rr-150m:
    seeds: 1
    tokens: 3000000000
    resources: {nodes: 2}
overrides:
  parallel.backend: fsdp
  parallel.precision: bf16
  parallel.ac: selective
  train.global_batch: 64
  train.max_steps: null  # the token budgets below decide
  train.micro_batch: 4
resources: {nodes: 1, gpus_per_node: 8}
gpu: H200
mfu: 0.35
"""


@pytest.fixture
def sweep_file(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    path = tmp_path / "plan-test.yaml"
    path.write_text(SWEEP)
    return path


def test_sweep_plans_every_run_and_sums_gpu_hours(capsys, sweep_file):
    assert main(["plan", str(sweep_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    runs = out["runs"]
    assert sorted(runs) == sorted(["rr-60m-review-s0", "rr-60m-review-s1", "rr-60m-standard-s0",
                                   "rr-60m-standard-s1", "rr-150m-review-s0", "rr-150m-standard-s0"])
    assert out["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in runs.values()))
    big = runs["rr-150m-review-s0"]
    assert big["gpus"] == 16 and big["gpu"] == "h200" and big["mfu"] == 0.35 and big["ac"] == "selective"
    assert big["global_batch"] == 64 and big["accum"] == 1 and big["tokens"] == 3e9
    # the run is the single-run plan of the same settings
    single = plan(Setup(ModelConfig(size="rr-150m", variant="review"), gpus=16, gpu="h200", ac="selective",
                        micro_batch=4, global_batch=64, tokens=3e9, mfu=0.35))
    assert big["memory_bytes"]["peak"] == single.total() and big["gpu_hours"] == pytest.approx(single.gpu_hours)
    # standard is widened to review's parameter count, as the trainer does it
    std, rev = runs["rr-60m-standard-s0"], runs["rr-60m-review-s0"]
    assert std["shape"]["d_ff"] > rev["shape"]["d_ff"]
    assert std["params"] == pytest.approx(rev["params"], rel=0.005)


def test_sweep_text_and_overrides(capsys, sweep_file):
    assert main(["plan", str(sweep_file), "--gpu", "a100", "--mfu", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "6 runs:" in out and "GPU-hours in all" in out and "A100" in out and "rr-150m-standard-s0" in out


def test_sweep_refuses_single_run_flags(capsys, sweep_file):
    assert main(["plan", str(sweep_file), "--size", "rr-1b"]) == 2
    err = capsys.readouterr().err
    assert "--size plans one run" in err and len(err.splitlines()) == 1


def test_missing_sweep_file_is_one_line(capsys, tmp_path):
    assert main(["plan", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_sweep_plans_the_hsdp_mesh_the_trainer_builds(capsys, tmp_path):
    (tmp_path / "data").mkdir()
    path = tmp_path / "plan-test.yaml"
    path.write_text(SWEEP.replace("  train.micro_batch: 4\n", "  train.micro_batch: 4\n  parallel.dp_shard: 8\n"))
    assert main(["plan", str(path), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    big = runs["rr-150m-review-s0"]  # 16 GPUs: shard over 8, replicate over the 2 nodes
    assert big["gpus"] == 16 and big["dp_shard"] == 8 and runs["rr-60m-review-s0"]["dp_shard"] == 8
    single = plan(Setup(ModelConfig(size="rr-150m", variant="review"), gpus=16, gpu="h200", ac="selective",
                        micro_batch=4, global_batch=64, tokens=3e9, mfu=0.35, dp_shard=8))
    assert big["memory_bytes"]["peak"] == single.total()
    path.write_text(SWEEP.replace("  train.micro_batch: 4\n", "  train.micro_batch: 4\n  parallel.dp_shard: 3\n"))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "parallel.dp_shard (3) x parallel.dp_replicate (None) must equal the world size (8)" in err
    assert len(err.splitlines()) == 1

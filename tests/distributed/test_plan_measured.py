"""The plan's predicted peak against the measured peak on CPU (fp32): tiny and a ~20M model, one process and
FSDP2 on 2 ranks (gloo, srun-style ranks forked by the tests' fork server: tests/distributed/rankutil.py); in one
process (this one) also activation checkpointing (full) and a multi-stream rule (mHC, 4 streams) with selective
checkpointing, on 2 blocks (one checkpointed, one kept: the n-fold state and both kinds of block at half the CPU
of the preset's 4 blocks, met as closely, 1.1%). The worker runs two real steps of the model and engine under
torch's MemTracker (tests/distributed/plan_peak_worker.py), every case of a test in one process, eagerly
(`train.compile=false`): the plan models eager steps, and met them within 2% here (a cold inductor compile of
each case's blocks also tripled the test's time). Runtime: about 40 CPU seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distributed.plan_peak_worker import peaks
from distributed.rankutil import run_ranks
from rrtrain.config import ModelConfig
from rrtrain.core.dist import DistInfo
from rrtrain.parallel.memory import Setup, plan

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
WORKER = "tests.distributed.plan_peak_worker"
M20 = {"d_model": 256, "n_layers": 8, "n_heads": 4}
CASES = {  # name: (model keys over the tiny preset, parallel.ac)
    "tiny": ({}, "none"),
    "20m": (M20, "none"),
}
ONE_PROCESS = {  # the rule's n-fold state and checkpointing; mHC's many small ops are slow under MemTracker
    "20m-ac-full": (M20, "full"),
    "tiny-mhc-ac-selective": ({"variant": "mhc", "n_layers": 2}, "selective"),
}
MICRO = 4


def cases_for(nproc: int) -> dict[str, tuple[dict, str]]:
    return {**CASES, **ONE_PROCESS} if nproc == 1 else CASES


def measure(tmp: Path, nproc: int) -> dict[str, int]:
    """Peak bytes per case, all cases in this process (or in one job of `nproc` ranks)."""
    cases = {}
    for name, (model, ac) in cases_for(nproc).items():
        over = ["model.size=tiny"] + [f"model.{k}={v}" for k, v in model.items()]
        over += [f"train.micro_batch={MICRO}", "parallel.precision=fp32", f"parallel.ac={ac}",
                 "train.compile=false"]
        cases[name] = over + (["parallel.backend=fsdp"] if nproc > 1 else [])
    if nproc == 1:
        return peaks(cases, DistInfo(0, 1, 0, torch.device("cpu")))
    (tmp / "cases.json").write_text(json.dumps(cases))
    out = tmp / "peaks.json"
    proc = run_ranks(WORKER, [str(out), str(tmp / "cases.json")], nproc, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("nproc", [1, 2])
def test_predicted_peak_within_20_percent(tmp_path, nproc):
    measured = measure(tmp_path, nproc)
    for name, (model, ac) in cases_for(nproc).items():
        setup = Setup(ModelConfig(size="tiny", **model), gpus=nproc, backend="fsdp" if nproc > 1 else "none",
                      precision="fp32", micro_batch=MICRO, ac=ac)
        predicted = plan(setup).total()
        assert abs(predicted - measured[name]) <= 0.20 * measured[name], (name, predicted, measured[name])

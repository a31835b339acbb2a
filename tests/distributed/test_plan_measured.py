"""The plan's predicted peak against the measured peak on CPU (fp32): tiny and a ~20M model, one process and
FSDP2 on 2 ranks (torchrun, gloo); in one process also activation checkpointing (full) and a multi-stream
rule (mHC, 4 streams) with selective checkpointing. The worker runs two real steps of the model and engine
under torch's MemTracker (tests/distributed/plan_peak_worker.py), every case of a test in one process, eagerly
(`train.compile=false`): the plan models eager steps, and met them within 2% here (a cold inductor compile of
each case's blocks also tripled the test's time). Runtime: about 25 s on 2 quiet cores.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rrtrain.config import ModelConfig
from rrtrain.parallel.memory import Setup, plan
from tests.trainutil import PY, REPO, env, free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
WORKER = str(Path(__file__).with_name("plan_peak_worker.py"))
M20 = {"d_model": 256, "n_layers": 8, "n_heads": 4}
CASES = {  # name: (model keys over the tiny preset, parallel.ac)
    "tiny": ({}, "none"),
    "20m": (M20, "none"),
}
ONE_PROCESS = {  # the rule's n-fold state and checkpointing; mHC's many small ops are slow under MemTracker
    "20m-ac-full": (M20, "full"),
    "tiny-mhc-ac-selective": ({"variant": "mhc"}, "selective"),
}
MICRO = 4


def cases_for(nproc: int) -> dict[str, tuple[dict, str]]:
    return {**CASES, **ONE_PROCESS} if nproc == 1 else CASES


def measure(tmp: Path, nproc: int) -> dict[str, int]:
    """Peak bytes per case, all cases in one process (or one torchrun job): process start-up dominates."""
    cases = {}
    for name, (model, ac) in cases_for(nproc).items():
        over = ["model.size=tiny"] + [f"model.{k}={v}" for k, v in model.items()]
        over += [f"train.micro_batch={MICRO}", "parallel.precision=fp32", f"parallel.ac={ac}",
                 "train.compile=false"]
        cases[name] = over + (["parallel.backend=fsdp"] if nproc > 1 else [])
    (tmp / "cases.json").write_text(json.dumps(cases))
    out = tmp / "peaks.json"
    args = [WORKER, str(out), str(tmp / "cases.json")]
    cmd = [PY, *args] if nproc == 1 else [PY, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                                         "--master_addr=127.0.0.1", f"--master_port={free_port()}", *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
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

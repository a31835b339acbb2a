"""The rules of issue 49 (peri_ln, ln_scaling, layer_scalars, laurel, denseformer, laurel's PA form, value_residual,
frac, ngpt, mudd) under the real trainer: each trains 4 steps under FSDP2 on 2 CPU ranks (gloo), checkpointing at
step 2; a run resumed from that step-2 checkpoint ends exactly where the 4 steps straight end (losses and
parameters, bit for bit; nGPT's matrices on the unit sphere, which its hook keeps across the shards); then bf16
under FSDP2's policy: 4 optimizer steps of each rule's engine as training builds it, stepped by the trainer's own
optimizer step, every rule in turn in ONE job of 2 ranks (tests/distributed/bf16_rules_worker.py; a training run
per rule cost a launch each, a third of this file). Both runs of the resume check have the same schedule
(max_steps 4), so the resumed run must restore its place in it. A small model (d_model 32, 2 blocks, 2 heads):
what is checked is the rule's state under sharding, checkpointing and casting, which any width has. Runtime: 2
runs of 2 ranks per rule and the bf16 job, about 55 CPU seconds; `rrtrain check-rule NAME` runs the resume and
one-process parity checks on any rule as well.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from distributed.rankutil import run_ranks
from trainutil import checkpoint_tensors, final, losses, max_rel_diff, train

pytestmark = pytest.mark.distributed

NEW = ["peri_ln", "ln_scaling", "layer_scalars", "laurel", "denseformer", "laurel_pa", "value_residual", "frac",
       "ngpt", "mudd"]
# a label that is not a rule's name: the rule and its knobs
LABELS = {"laurel_pa": ["model.variant=laurel", "model.residual.laurel_form=pa"]}


ARGS = ["train.max_steps=4", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=2", "train.global_batch=4",
        "train.micro_batch=2", "train.warmup_steps=1", "parallel.backend=fsdp", "model.d_model=32",
        "model.n_layers=2", "model.n_heads=2", "data.eval_batches=1"]


def rule_args(label: str) -> list[str]:
    return LABELS.get(label, [f"model.variant={label}"])


def from_checkpoint(src: Path, step: int, dest: Path) -> Path:
    """A fresh run directory whose only checkpoint is `src`'s at `step` (as if the run had stopped there)."""
    name = f"step_{step:08d}"
    shutil.copytree(src / "checkpoints" / name, dest / "checkpoints" / name)
    (dest / "checkpoints" / "latest").write_text(name + "\n")
    return dest


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW)
def test_trains_two_steps_under_fsdp_and_resumes_exactly(tmp_path, stories_data, variant):
    args = [*ARGS, *rule_args(variant)]
    straight = tmp_path / "straight"
    train(straight, stories_data, *args, nproc=2)
    split = from_checkpoint(straight, 2, tmp_path / "split")
    proc = train(split, stories_data, *args, nproc=2)
    assert "resumed at step 2" in proc.stdout, proc.stdout[-2000:]
    assert sorted(losses(straight)) == [1, 2, 3, 4] and sorted(losses(split)) == [3, 4]
    assert max_rel_diff({k: losses(straight)[k] for k in (3, 4)}, losses(split)) == 0.0
    pa, pb = checkpoint_tensors(straight), checkpoint_tensors(split)
    assert pa.keys() == pb.keys()
    for key in pa:
        assert torch.equal(pa[key], pb[key]), key
    assert final(split)["world_size"] == 2
    if variant == "ngpt":  # its hook after every step, on FSDP2's dim-0 shards: the columns' norms span both ranks
        for key, dim in [("tok_emb.weight", 1)] + [(f"blocks.{i}.{m}", d) for i in range(2) for m, d in
                                                   (("attn.qkv.weight", 1), ("attn.proj.weight", 0),
                                                    ("mlp.fc.weight", 1), ("mlp.proj.weight", 0))]:
            norms = torch.linalg.vector_norm(pb[key].double(), dim=dim)
            torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-6, msg=key)


@pytest.fixture(scope="module")
def bf16_steps(tmp_path_factory) -> dict[str, dict[str, list[float]]]:
    """Every rule of NEW stepped 4 times under FSDP2's bf16 policy on 2 ranks, all in one job
    (tests/distributed/bf16_rules_worker.py): {label: {"losses": [...], "skipped": [...]}}."""
    tmp = tmp_path_factory.mktemp("bf16")
    bf16 = ["train.global_batch=4", "train.micro_batch=2", "parallel.backend=fsdp", "parallel.precision=bf16"]
    (tmp / "cases.json").write_text(json.dumps({label: [*rule_args(label), *bf16] for label in NEW}))
    proc = run_ranks("tests.distributed.bf16_rules_worker", [str(tmp / "out.json"), str(tmp / "cases.json"), "4"], 2)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    return json.loads((tmp / "out.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW)
def test_fsdp_bf16(bf16_steps, variant):
    """FSDP2 casts the blocks' inputs and parameters to bf16 (layer_scalars' pair state, ln_scaling's fp32 buffer):
    4 optimizer steps, every loss finite and no step skipped."""
    got = bf16_steps[variant]
    assert len(got["losses"]) == 4 and all(math.isfinite(v) for v in got["losses"]), got
    assert got["skipped"] == [0.0] * 4, got

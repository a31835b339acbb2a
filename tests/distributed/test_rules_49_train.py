"""The rules of issue 49 (peri_ln, ln_scaling, layer_scalars, laurel, denseformer, laurel's PA form, value_residual,
frac, ngpt, mudd) under the real trainer: each trains 2 steps under FSDP2 on 2 CPU ranks (gloo), resumes from that
checkpoint to step 4 and ends exactly where 4 steps straight end (losses and parameters, bit for bit; nGPT's
matrices on the unit sphere, which its hook keeps across the shards); then bf16 under FSDP2's policy. A constant learning rate after warm-up
(`min_lr_ratio=1`), so the 2-step run follows the 4-step run's schedule. Runtime: about 1 minute per rule on 2
cores; `rrtrain check-rule NAME` runs the resume and one-process parity checks on any rule as well.
"""

from __future__ import annotations

import math

import pytest
import torch

from trainutil import checkpoint_tensors, final, losses, max_rel_diff, train

pytestmark = pytest.mark.distributed

NEW = ["peri_ln", "ln_scaling", "layer_scalars", "laurel", "denseformer", "laurel_pa", "value_residual", "frac",
       "ngpt", "mudd"]
# a label that is not a rule's name: the rule and its knobs
LABELS = {"laurel_pa": ["model.variant=laurel", "model.residual.laurel_form=pa"]}


ARGS = ["train.log_every=1", "train.eval_every=0", "train.ckpt_every=2", "train.global_batch=4",
        "train.micro_batch=2", "train.warmup_steps=1", "train.min_lr_ratio=1.0", "parallel.backend=fsdp"]


def rule_args(label: str) -> list[str]:
    return LABELS.get(label, [f"model.variant={label}"])


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW)
def test_trains_two_steps_under_fsdp_and_resumes_exactly(tmp_path, stories_data, variant):
    args = [*ARGS, *rule_args(variant)]
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(straight, stories_data, *args, "train.max_steps=4", nproc=2)
    train(split, stories_data, *args, "train.max_steps=2", nproc=2)
    assert sorted(losses(split)) == [1, 2]
    train(split, stories_data, *args, "train.max_steps=4", "train.allow_config_change=true", nproc=2)
    assert sorted(losses(split)) == sorted(losses(straight)) == [1, 2, 3, 4]
    assert max_rel_diff(losses(straight), losses(split)) == 0.0
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


@pytest.mark.slow
@pytest.mark.parametrize("variant", NEW)
def test_fsdp_bf16(tmp_path, stories_data, variant):
    """FSDP2 casts the blocks' inputs and parameters to bf16 (layer_scalars' pair state, ln_scaling's fp32 buffer)."""
    run = tmp_path / variant
    train(run, stories_data, *ARGS, *rule_args(variant), "train.max_steps=4", "parallel.precision=bf16",
          nproc=2)
    got = losses(run)
    assert sorted(got) == [1, 2, 3, 4] and all(math.isfinite(v) for v in got.values())

"""The non-finite skip decided on the device (no host sync): a skipped step changes no weight, no AdamW
moment and no step count; a finite step after it updates as usual. Runtime: about 1 s."""

from __future__ import annotations

import torch

from rrtrain.config import Config, ModelConfig
from rrtrain.core.dist import DistInfo
from rrtrain.resolve import build_model
from rrtrain.parallel import build_engine


def snapshot(engine) -> dict[str, torch.Tensor]:
    out = {f"p.{n}": p.detach().clone() for n, p in engine.model.named_parameters()}
    for i, state in enumerate(engine.optimizer.state.values()):
        out.update({f"s{i}.{k}": v.detach().clone() for k, v in state.items() if torch.is_tensor(v)})
    return out


def test_step_unless_nonfinite_leaves_weights_and_optimizer_state_alone():
    torch.manual_seed(0)
    cfg = Config()
    cfg.model = ModelConfig(size="tiny", variant="review", d_model=32, n_layers=1, n_heads=4, d_ff=64, seq_len=8,
                            vocab_size=64)
    cfg.train.compile = False  # the default's token budget would compile the blocks: not under test here
    engine = build_engine(build_model(cfg.model), cfg, DistInfo(0, 1, 0, torch.device("cpu")))
    idx = torch.randint(0, 64, (2, 9))

    def grads(scale: float) -> torch.Tensor:
        loss = engine.forward(idx[:, :-1], idx[:, 1:]) * scale
        engine.backward(loss, last_micro=True)
        norm = engine.clip_grad_norm(1.0)
        return (~(torch.isfinite(loss) & torch.isfinite(norm))).float()

    assert grads(1.0).item() == 0.0
    engine.step_unless(1e-2, torch.tensor(0.0))  # a normal step first: moments and step counts exist
    before = snapshot(engine)
    flag = grads(float("nan"))
    assert flag.item() == 1.0
    engine.step_unless(1e-2, flag)
    after = snapshot(engine)
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    assert all(p.grad is None for p in engine.model.parameters())  # the bad gradients are gone
    engine.step_unless(1e-2, grads(1.0))
    moved = snapshot(engine)
    assert not torch.equal(moved["p.tok_emb.weight"], after["p.tok_emb.weight"])
    steps = [v for k, v in moved.items() if k.endswith(".step")]
    assert steps and all(float(s) == 2.0 for s in steps)  # the skipped step was not counted by AdamW

"""The gate as written (W applied block by block to factored norms) equals the concatenated form it
replaced, kept here as the oracle: z = [RMSN_h(h); RMSN_u(u)], r = sigma(W z + b), to 1e-6 in fp32 (normwise),
forward and backward (inputs and every parameter), full- and low-rank, with every parameter away from
its initial value. Runtime: about 1 s."""

from __future__ import annotations

import pytest
import torch

from rrtrain import residuals
from rrtrain.config import ResidualConfig
from rrtrain.residuals import SiteInfo

GATED = ("review", "review_convex", "highway", "highway_convex")


def oracle_write(site: torch.nn.Module, state: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The concatenated form: normalised copies side by side, one matmul, then the merge."""
    z = site.gate_norm_h(state)
    if site.gate_norm_u is not None:
        z = torch.cat([z, site.gate_norm_u(y)], dim=-1)  # (B, T, 2D)
    gate = site.gate
    logits = gate.up(gate.down(z)) if gate.rank > 0 else gate.proj(z)
    r = torch.sigmoid(logits + gate.bias)
    return state + r * (y - state) if site.convex else state + r * y


@pytest.mark.parametrize("rank", [0, 8])
@pytest.mark.parametrize("name", GATED)
def test_gate_equals_the_concatenated_oracle(name, rank):
    torch.manual_seed(0)
    d = 48
    site = residuals.get(name).site(SiteInfo(d, 3, 8, "mlp", 1e-6, ResidualConfig(gate_rank=rank)))
    with torch.no_grad():
        for p in site.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))  # gains and bias near 1
    state = (torch.randn(3, 10, d) * 2.0).requires_grad_()  # the state grows with depth; u stays near 1
    y = torch.randn(3, 10, d).requires_grad_()
    cot = torch.randn(3, 10, d)

    def run(write):
        site.zero_grad(set_to_none=True)
        state.grad = y.grad = None
        out = write(state, y)
        out.backward(cot)
        grads = {n: p.grad.clone() for n, p in site.named_parameters() if p.grad is not None}
        return out.detach(), state.grad.clone(), y.grad.clone(), grads

    out, gs, gy, gp = run(lambda s, u: site.write(s, u, None))
    ref, rs, ry, rp = run(lambda s, u: oracle_write(site, s, u))

    def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        """Normwise: max |a - b| <= 1e-6 * max |b| (sums reassociated in fp32 differ in their last bits)."""
        err = float((a - b).abs().max() / b.abs().max())
        assert err <= 1e-6, f"{what}: relative difference {err:.2e}"

    r = (out - state) / y if not site.convex else (out - state) / (y - state)
    assert r.std() > 0.05  # the gate varies per token and channel: the test exercises W, not only b
    close(out, ref, "output")
    close(gs, rs, "grad of the state")
    close(gy, ry, "grad of the update")
    assert sorted(gp) == sorted(rp) == sorted(n for n, _ in site.named_parameters() if n != "norm.weight")
    for n in gp:
        close(gp[n], rp[n], f"grad of {n}")

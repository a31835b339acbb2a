"""The gate as written (W applied block by block to factored norms) equals the concatenated form it
replaced, kept here as the oracle: z = [RMSN_h(h); RMSN_u(u)], r = sigma(W z + b), to 1e-6 in fp32 (normwise),
forward and backward (inputs and every parameter), full- and low-rank, with every parameter away from
its initial value. Runtime: about 1 s."""

from __future__ import annotations

import copy

import pytest
import torch

from rrtrain import residuals
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
    site = residuals.get(name).site(SiteInfo(d, 3, 8, "mlp", 1e-6, residuals.get(name).make_knobs(gate_rank=rank)))
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


@pytest.mark.parametrize("mode", ["bf16", "autocast"])
@pytest.mark.parametrize("name", GATED)
def test_gate_in_bf16_follows_the_oracle_and_keeps_dtypes(name, mode):
    """The hand-written backward in the two bf16 settings the trainer uses: everything bf16 (FSDP's
    param_dtype) and fp32 weights and state under CPU autocast (one process), where the update comes out of
    a bf16 matmul. Each gradient keeps its input's dtype (the fp32 state's gradient is not rounded to bf16)
    and agrees with the fp64 oracle to bf16 precision. (The convex rules used to stop under autocast:
    torch.lerp refused the fp32 state with the bf16 update.)"""
    torch.manual_seed(0)
    d = 48
    site = residuals.get(name).site(SiteInfo(d, 3, 8, "mlp", 1e-6, residuals.get(name).make_knobs()))
    with torch.no_grad():
        for p in site.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    state, y, cot = torch.randn(3, 10, d) * 2.0, torch.randn(3, 10, d), torch.randn(3, 10, d)
    ref_site = copy.deepcopy(site).double()  # before `site` (the autocast case's own) gets gradients
    s64, y64 = state.double().requires_grad_(), y.double().requires_grad_()
    oracle_write(ref_site, s64, y64).backward(cot.double())

    low = site if mode == "autocast" else copy.deepcopy(site).to(torch.bfloat16)
    s_low = (state.clone() if mode == "autocast" else state.bfloat16()).requires_grad_()
    y_low = y.bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
        out = low.write(s_low, y_low, None)
    out.backward(cot.to(out.dtype))
    assert s_low.grad.dtype == s_low.dtype and y_low.grad.dtype == torch.bfloat16
    assert all(p.grad is None or p.grad.dtype == p.dtype for p in low.parameters())

    params = dict(low.named_parameters())
    pairs = [(s_low.grad, s64.grad), (y_low.grad, y64.grad)]
    pairs += [(params[n].grad, p.grad) for n, p in ref_site.named_parameters() if p.grad is not None]
    for got, want in pairs:
        err = float((got.double() - want).abs().max() / want.abs().max())
        assert err <= 0.03, f"relative difference {err:.2e}"

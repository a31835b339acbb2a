"""The learned gate of every gated residual rule, r = sigma(W z + b), and the merge it scales.

Eager mode pays per kernel and per autograd node, so the gate and its merge are one autograd function
with a hand-written backward (`_GatedMerge`): the normalised inputs z are never built, and the backward
runs each elementwise pass once instead of once per small op (measured in docs/performance.md).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .norm import inv_rms


class Gate(nn.Module):
    """r = sigma(W z + b), W: in_features -> d, z = [RMSN_h(h); RMSN_u(u)] (or RMSN_h(h) alone), and the merge
    h + r*u (additive) or (1 - r)*h + r*u (convex).

    Full rank (rank = 0): W = 0 at start, so r = sigmoid(b) everywhere (0.5 for b = 0, Eq. 1 of the paper).
    Low rank (rank = k): W = U V with V: in -> k, U: k -> d; U = 0 and V ~ N(0, 0.02) at start, which gives
    the same r at start but, unlike U = V = 0, lets both factors learn.

    z is never built. W's columns are split into one block W_i per input, and since each normalised
    input is RMSN_i(x) = s(x) * (x * g_i) with s(x) = 1/rms(x) one scalar per row,
        W z = sum_i s(x_i) * (x_i @ (W_i * g_i)^T).
    The gains fold into the (small) weight instead of the activations. The parameters are those of the
    concatenated form (same names, same shapes), which tests/unit/rrtrain/residuals/test_gate_oracle.py keeps as
    the oracle.
    """

    def __init__(self, in_features: int, d: int, rank: int, bias_init: float) -> None:
        super().__init__()
        self.rank, self.bias_init = rank, bias_init
        if rank > 0:
            self.down = nn.Linear(in_features, rank, bias=False)
            self.up = nn.Linear(rank, d, bias=False)
        else:
            self.proj = nn.Linear(in_features, d, bias=False)
        self.bias = nn.Parameter(torch.empty(d))
        self.reset_parameters()

    @staticmethod
    def count(in_features: int, d: int, rank: int) -> int:
        return (rank * in_features + d * rank if rank > 0 else in_features * d) + d

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        with torch.no_grad():
            if self.rank > 0:
                nn.init.normal_(self.down.weight, std=0.02, generator=generator)
                nn.init.zeros_(self.up.weight)
            else:
                nn.init.zeros_(self.proj.weight)
            self.bias.fill_(self.bias_init)

    def forward(self, state: torch.Tensor, update: torch.Tensor, gains: Sequence[torch.Tensor], eps: float,
                convex: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(merged state, r). The gate reads (state, update)[:len(gains)], each RMS-normalised with epsilon
        `eps` and multiplied by its gain times sqrt(d) (`gains[i]`, shape (d,)); r is detached (statistics)."""
        first = self.down.weight if self.rank > 0 else self.proj.weight  # (out, in_features)
        gain = torch.cat(list(gains)) if len(gains) > 1 else gains[0]
        blocks = (first * gain).split(state.shape[-1], dim=1)  # W_i * g_i, (out, d)
        up = self.up.weight if self.rank > 0 else None
        if not torch.is_grad_enabled():  # no backward to serve (evaluation): the same forward, without the Function
            # (dynamo traces a Function's forward under no_grad without its ctx: a graph break in compiled eval)
            out, r, _ = _merge(convex, eps, state, update, self.bias, up, blocks)
            return out, r
        return _GatedMerge.apply(convex, eps, state, update, self.bias, up, *blocks)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _merge(convex: bool, eps: float, state: torch.Tensor, update: torch.Tensor, bias: torch.Tensor,
           up: Optional[torch.Tensor], blocks: Sequence[torch.Tensor]):
    """_GatedMerge's forward: (out, r, (scales, terms, q)), the last what its backward reads."""
    xs = (state, update)[:len(blocks)]
    scales, terms, q = [], [], None
    for x, block in zip(xs, blocks):
        s = inv_rms(x, eps)  # (..., 1), fp32 or wider
        t, sx = F.linear(x, block), s.to(x.dtype)
        if q is not None:
            q = torch.addcmul(q, t, sx)
        else:
            q = t * sx if up is not None else torch.addcmul(bias.to(x.dtype), t, sx)
        scales.append(s)
        terms.append(t)
    p = F.linear(q, up, bias) if up is not None else q
    r = torch.sigmoid(p)
    # convex: h + r (u - h), not torch.lerp, which refuses an fp32 state with a bf16 update (autocast)
    out = torch.addcmul(state, r, update - state if convex else update)
    return out, r, (scales, terms, q)


class _GatedMerge(torch.autograd.Function):
    """Forward: s_i = 1/rms(x_i); q = sum_i s_i * (x_i @ B_i^T); p = q + b (full rank) or q @ U^T + b (low rank);
    r = sigmoid(p); out = h + r*u or h + r*(u - h). Inputs x = (h, u)[:len(B)].

    Backward, with G = dL/dout: dr = G*u (G*(u - h) convex); dp = dr*r*(1 - r); dq = dp (@ U); per input
    dB_i = (dq*s_i)^T x_i, dx_i = (dq*s_i) @ B_i - s_i^3 (dq . t_i) x_i with t_i = x_i @ B_i^T, since
    ds/dx = -s^3 x for s = (|x|^2 + d eps)^(-1/2); plus the direct terms G (convex: G*(1 - r)) and G*r.
    Matmuls in the backward run in the dtype their forward ran in (bf16 under autocast); gradients return in
    each input's dtype.
    """

    @staticmethod
    def forward(ctx, convex: bool, eps: float, state: torch.Tensor, update: torch.Tensor, bias: torch.Tensor,
                up: Optional[torch.Tensor], *blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, r, (scales, terms, q) = _merge(convex, eps, state, update, bias, up, blocks)
        ctx.convex, ctx.n = convex, len(blocks)
        ctx.save_for_backward(state, update, bias, up, q if up is not None else None, r, *blocks, *scales, *terms)
        ctx.mark_non_differentiable(r)
        return out, r

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _grad_r: Optional[torch.Tensor]):
        state, update, bias, up, q, r, *rest = ctx.saved_tensors
        n = ctx.n
        blocks, scales, terms = rest[:n], rest[n:2 * n], rest[2 * n:]
        dr = grad * (update - state) if ctx.convex else grad * update
        dp = torch.ops.aten.sigmoid_backward(dr.to(r.dtype), r)
        grad_bias = _rows(dp).sum(0).to(bias.dtype)
        grad_up = None
        if up is not None:
            grad_up = (_rows(dp).t() @ _rows(q).to(dp.dtype)).to(up.dtype)
            dq = dp @ up.to(dp.dtype)
        else:
            dq = dp
        grad_xs, grad_blocks = [], []
        for x, block, s, t in zip((state, update), blocks, scales, terms):
            dt = (dq * s.to(x.dtype)).to(t.dtype)
            ds = torch.linalg.vecdot(dq, t.to(dq.dtype)).unsqueeze(-1)  # dL/ds, one per row
            grad_blocks.append((_rows(dt).t() @ _rows(x).to(t.dtype)).to(block.dtype))
            dx = (dt @ block.to(t.dtype)).to(x.dtype)  # a fresh tensor: the updates below may be in place
            grad_xs.append(dx.addcmul_(x, ds.to(s.dtype).mul_(s.pow(3)).to(x.dtype), value=-1.0))
        grad_state = grad_xs[0].add_(grad)
        if ctx.convex:
            grad_state.addcmul_(grad, r, value=-1.0)  # G*(1 - r)
        grad_update = grad_xs[1].addcmul_(grad, r) if n > 1 else (grad * r).to(update.dtype)
        return None, None, grad_state, grad_update, grad_bias, grad_up, *grad_blocks

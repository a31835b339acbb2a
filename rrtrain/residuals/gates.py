"""The learned gate sigma(W z + b), full-rank or low-rank, shared by every gated residual rule."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

#: one RMS-normalised gate input, kept factored: (x, s, g) stands for x * s * g, s one scalar per row
NormedInput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Gate(nn.Module):
    """r = sigma(W z + b), W: in_features -> d, z = [RMSN_1(x_1); RMSN_2(x_2); ...] (the inputs side by side).

    Full rank (rank = 0): W = 0 at start, so r = sigmoid(b) everywhere (0.5 for b = 0, Eq. 1 of the paper).
    Low rank (rank = k): W = U V with V: in -> k, U: k -> d; U = 0 and V ~ N(0, 0.02) at start, which gives
    the same r at start but, unlike U = V = 0, lets both factors learn.

    z is never built. W's columns are split into one block W_i per input, and since each normalised
    input is RMSN_i(x) = s(x) * (x * g_i) with s(x) one scalar per row,
        W z = sum_i s(x_i) * (x_i @ (W_i * g_i)^T).
    The gains fold into the (small) weight instead of the activations, and the normalised copies, the
    concatenation and its backward disappear: in eager mode the gate costs its matmuls plus a few
    elementwise passes. The parameters are those of the concatenated form (same names, same shapes).
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

    def forward(self, inputs: Sequence[NormedInput]) -> torch.Tensor:
        """r for the normalised inputs given factored as (x, s, g): shapes (..., d_i), (..., 1), (d_i,)."""
        first = self.down.weight if self.rank > 0 else self.proj.weight  # (out, in_features)
        gains = torch.cat([g for _, _, g in inputs]) if len(inputs) > 1 else inputs[0][2]
        blocks = (first * gains).split([x.shape[-1] for x, _, _ in inputs], dim=1)  # W_i * g_i, (out, d_i)
        acc = None
        for (x, scale, _), block in zip(inputs, blocks):
            term, scale = F.linear(x, block), scale.to(x.dtype)
            if acc is not None:
                acc = torch.addcmul(acc, term, scale)
            else:
                acc = term * scale if self.rank > 0 else torch.addcmul(self.bias.to(x.dtype), term, scale)
        if self.rank > 0:
            acc = F.linear(acc, self.up.weight, self.bias)
        return torch.sigmoid(acc)

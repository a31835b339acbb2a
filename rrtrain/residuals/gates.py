"""The learned gate sigma(W z + b), full-rank or low-rank, shared by every gated residual rule."""

from __future__ import annotations

import torch
from torch import nn


class Gate(nn.Module):
    """r = sigma(W z + b), W: in_features -> d.

    Full rank (rank = 0): W = 0 at start, so r = sigmoid(b) everywhere (0.5 for b = 0, Eq. 1 of the paper).
    Low rank (rank = k): W = U V with V: in -> k, U: k -> d; U = 0 and V ~ N(0, 0.02) at start, which gives
    the same r at start but, unlike U = V = 0, lets both factors learn.
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

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.rank > 0:
                nn.init.normal_(self.down.weight, std=0.02)
                nn.init.zeros_(self.up.weight)
            else:
                nn.init.zeros_(self.proj.weight)
            self.bias.fill_(self.bias_init)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        logits = self.up(self.down(z)) if self.rank > 0 else self.proj(z)
        return torch.sigmoid(logits + self.bias)

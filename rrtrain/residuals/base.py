"""The residual-rule interface: how a sublayer's output is merged into the residual state.

A rule has two parts, as docs/residuals.md describes:

* a `Stream` at the model's two ends: `expand(e) -> state` builds the residual state from the token
  embeddings, `readout(state) -> z` gives the tensor that goes to the LM head (final norm included);
* one `Site` per sublayer: `read(state) -> (x, ctx)` gives the sublayer's input (pre-norm included),
  `write(state, y, ctx) -> state` folds the sublayer's output `y` back in.

Most rules act only on the state. A rule whose definition reaches inside the sublayer (Fixup: scalar
biases between the branch's layers, a zero last layer) or prescribes the embedding's initialisation
(T-Fixup) gets those modules through `Site.attach(branch)` and `Stream.attach(tok_emb, pos_emb)`, which
the model calls once after building them; by default both do nothing. The rule may register hooks on
what it is given and re-initialise it in its own `reset_parameters` (the model calls that after its
own initialisation), so the block itself stays unaware of any rule.

The state is opaque to the transformer block: a tensor (B, T, D) for single-stream rules, (B, T, n, D)
for multi-stream ones, or a tuple of tensors for depth-aggregating ones. The block only passes it along,
so a new rule never touches the block. Keep its structure (shapes, strides, how many tensors) and what forward
reads of a site's plain attributes the same from block to block: `train.compile` compiles each block, and
dynamo compiles one more graph wherever they differ (tests/unit/rrtrain/residuals/test_compile_rules.py counts
them).

A rule module declares the rest in one place: its knobs (a dataclass of `model.residual` keys with their
defaults and a `check()`), the `count(d, cfg)` of its Site and Stream (the analytic parameter count, which
`rrtrain check-rule` holds against the built modules) and a `RuleSpec`. docs/residuals.md shows a complete
rule shipped from another package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn

from rrtrain.config import ResidualConfig
from rrtrain.core.errors import UsageError

State = Any  # torch.Tensor, or a tuple of tensors for depth-aggregating rules


GATE_BINS = 20  # gate histogram bins on [0, 1], recorded on diagnostic steps


@dataclass(frozen=True)
class SiteInfo:
    """Where a site sits in the model; passed to every site's constructor."""

    d_model: int
    index: int  # 0-based sublayer index over the whole model (block b: attention 2b, MLP 2b+1)
    n_sublayers: int
    kind: str  # "attn" or "mlp"
    eps: float
    cfg: ResidualConfig

    @property
    def n_blocks(self) -> int:
        return self.n_sublayers // 2


@dataclass(frozen=True)
class StreamInfo:
    d_model: int
    n_sublayers: int
    eps: float
    cfg: ResidualConfig


class Site(nn.Module):
    """The residual merge around one sublayer. Subclasses implement read, write, reset_parameters."""

    #: parameter names (as in named_parameters of this module) excluded from weight decay
    no_decay: tuple[str, ...] = ()

    def __init__(self, info: SiteInfo) -> None:
        super().__init__()
        self.info = info
        self.record = False  # set by the trainer on diagnostic steps
        self.stats: dict[str, torch.Tensor] = {}

    @classmethod
    def count(cls, d: int, cfg: ResidualConfig) -> int:
        """Parameters of one site at width d, computed without building it (the rule's analytic formula)."""
        raise NotImplementedError(f"{cls.__qualname__}.count(d, cfg): give the site's parameter count")

    def read(self, state: State) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def write(self, state: State, y: torch.Tensor, ctx: Any) -> State:
        raise NotImplementedError

    def attach(self, branch: nn.Module) -> None:
        """Receive the sublayer this site wraps (attention or MLP). Default: the rule does not need it."""

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Initialise this site (and the branch it was attached to). Random draws take `generator`: the model
        passes its unit's own, so the weights do not depend on the world size or the sharding."""
        raise NotImplementedError

    def _record_gate(self, r: torch.Tensor) -> None:
        """Keep the gate's mean, spread and histogram on [0, 1] (GATE_BINS bins, for the dashboard) as detached
        device tensors (no host sync in forward)."""
        if self.record:
            r = r.detach().float()
            self.stats = {"gate_mean": r.mean(), "gate_std": r.std(),
                          "gate_hist": torch.histc(r, bins=GATE_BINS, min=0.0, max=1.0)}


class Stream(nn.Module):
    """The model-level ends of a residual rule."""

    no_decay: tuple[str, ...] = ()

    def __init__(self, info: StreamInfo) -> None:
        super().__init__()
        self.info = info

    @classmethod
    def count(cls, d: int, cfg: ResidualConfig) -> int:
        """Parameters of the stream at width d, computed without building it."""
        raise NotImplementedError(f"{cls.__qualname__}.count(d, cfg): give the stream's parameter count")

    def expand(self, e: torch.Tensor) -> State:
        raise NotImplementedError

    def readout(self, state: State) -> torch.Tensor:
        raise NotImplementedError

    def attach(self, tok_emb: nn.Embedding, pos_emb: Optional[nn.Embedding]) -> None:
        """Receive the model's embeddings (positions: None under RoPE). Default: the rule does not need them."""

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Initialise the stream (and the embeddings it was attached to); random draws take `generator`."""
        raise NotImplementedError


Count = Callable[[int, int, ResidualConfig], int]  # (d_model, n_sublayers, cfg) -> all the rule's parameters


@dataclass(frozen=True, kw_only=True)
class RuleSpec:
    """A registered residual rule: how to build it, and how many parameters it adds, without building it.

    `params` defaults to the stream's count plus one site's count per sublayer, each from its `count(d, cfg)`;
    `knobs` are the dataclasses of `model.residual` keys the rule reads (the registry declares them).
    """

    name: str
    site: Callable[[SiteInfo], Site]
    stream: Callable[[StreamInfo], Stream]
    summary: str
    params: Optional[Count] = None
    knobs: tuple[type, ...] = ()
    convex: bool = False  # the update replaces part of the state (Highway form): watched for depth stalls
    gated: bool = False  # has input-dependent gates whose statistics are logged
    post_norm: bool = False  # no pre-norm inside the branch (DeepNorm)
    branch_init_gain: Optional[Callable[[int], float]] = None  # n_blocks -> gain on branch weights at init

    def __post_init__(self) -> None:
        if self.params is None:
            object.__setattr__(self, "params", _counted(self.site, self.stream))


def _counted(site: Any, stream: Any) -> Count:
    def params(d: int, n_sublayers: int, cfg: ResidualConfig) -> int:
        return stream.count(d, cfg) + n_sublayers * site.count(d, cfg)

    return params


def require(knobs: Any, positive: Iterable[str] = (), non_negative: Iterable[str] = ()) -> None:
    """A knob class's range checks: a one-line UsageError naming `model.residual.<name>`, as config.py words
    its own."""
    for name in positive:
        value = getattr(knobs, name)
        if not value > 0:
            raise UsageError(f"model.residual.{name} must be positive, got {value}")
    for name in non_negative:
        value = getattr(knobs, name)
        if value < 0:
            raise UsageError(f"model.residual.{name} must not be negative, got {value}")

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
own initialisation), so the block itself stays unaware of any rule. A rule that feeds attention's inputs (value
residuals) declares the capability on its attention site (`Site.attention_inputs`) and gives the attention its
q, k, v in `Site.qkv`; the block asks the site about the capability, never the rule's name.

The state is opaque to the transformer block: a tensor (B, T, D) for single-stream rules, (B, T, n, D)
for multi-stream ones, or a tuple of tensors for depth-aggregating ones. The block only passes it along,
so a new rule never touches the block. Keep its structure (shapes, strides, how many tensors) and what forward
reads of a site's plain attributes the same from block to block: `train.compile` compiles each block, and
dynamo compiles one more graph wherever they differ (tests/unit/rrtrain/residuals/test_compile_rules.py counts
them).

A rule module declares the rest in one place: its knobs (a dataclass of `model.residual` keys with their
defaults and a `check()`), the `count(d, cfg)` of its Site and Stream (the analytic parameter count, which
`rrtrain check-rule` holds against the built modules) and a `RuleSpec`. A site or stream reads its rule's
knobs as `info.cfg` (a `RuleKnobs`: `info.cfg.streams`), whichever of the rule's knob classes declares them.
docs/residuals.md shows a complete rule shipped from another package.

This package (with rrtrain/model/) imports nothing else of rrtrain, and its modules import each other by
relative imports of one dot: `rrtrain export` copies the files as they are beside an exported model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

import torch
from torch import nn

from .composition import Composition

State = Any  # torch.Tensor, or a tuple of tensors for depth-aggregating rules


class KnobError(ValueError):
    """A knob value a knob class's `check()` refuses, worded as one line that names `model.residual.<name>`.
    rrtrain reports it as bad input (exit 2); it is this package's own so that the package stands alone."""


class RuleKnobs:
    """One rule's `model.residual` values: an instance of each of the rule's knob dataclasses, read as one
    namespace (`knobs.streams`), so a site reads a knob without knowing which of its rule's classes declares it.
    Read-only: a rule is built from these values and never changes them."""

    __slots__ = ("_parts", "_owner")

    def __init__(self, parts: Iterable[Any] = ()) -> None:
        parts = tuple(parts)
        owner: dict[str, Any] = {}
        for part in parts:
            if not dataclasses.is_dataclass(part) or isinstance(part, type):
                raise TypeError(f"residual knobs are dataclass instances, got {part!r}")
            for f in dataclasses.fields(part):
                if f.name in owner:
                    raise ValueError(f"model.residual.{f.name} is declared by both {type(owner[f.name]).__qualname__}"
                                     f" and {type(part).__qualname__}")
                owner[f.name] = part
        object.__setattr__(self, "_parts", parts)
        object.__setattr__(self, "_owner", owner)

    @classmethod
    def of(cls, knobs: Iterable[type], values: Mapping[str, Any]) -> "RuleKnobs":
        """Each knob class built from its own fields' values in `values` (its defaults for the rest). A name no
        class declares is a TypeError: the values were meant for this rule, checked and typed beforehand."""
        knobs = tuple(knobs)
        declared = {f.name for k in knobs for f in dataclasses.fields(k)}
        unknown = sorted(set(values) - declared)
        if unknown:
            raise TypeError(f"residual knobs got an unexpected name '{unknown[0]}' (declared: "
                            f"{', '.join(sorted(declared)) or 'none'})")
        return cls(k(**{f.name: values[f.name] for f in dataclasses.fields(k) if f.name in values}) for k in knobs)

    @property
    def parts(self) -> tuple[Any, ...]:
        return self._parts

    def __getattr__(self, name: str) -> Any:  # only for names that are not attributes of the class
        if name.startswith("_"):  # a slot not set yet (copy, pickle): never a knob
            raise AttributeError(name)
        owner = self._owner.get(name)
        if owner is None:
            raise AttributeError(f"model.residual has no knob '{name}' for this rule (its knobs: "
                                 f"{', '.join(self._owner) or 'none'})")
        return getattr(owner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("residual knobs are read-only once a rule is built from them")

    def __reduce__(self) -> tuple:  # copy and pickle through the constructor (the slots are read-only)
        return (type(self), (self._parts,))

    def values(self) -> dict[str, Any]:
        """Every knob's value, in the order the classes declare them."""
        return {name: getattr(part, name) for name, part in self._owner.items()}

    def check(self) -> None:
        """Each knob class's own `check()`: a one-line KnobError naming the key."""
        for part in self._parts:
            check = getattr(part, "check", None)
            if check is not None:
                check()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RuleKnobs) and self.values() == other.values()

    __hash__ = None  # type: ignore[assignment]  (its parts are mutable dataclasses)

    def __repr__(self) -> str:
        return "RuleKnobs(" + ", ".join(f"{k}={v!r}" for k, v in self.values().items()) + ")"


#: names a knob may not take: they would hide a method of RuleKnobs
RESERVED_KNOB_NAMES = frozenset(name for name in dir(RuleKnobs) if not name.startswith("__"))


GATE_BINS = 20  # gate histogram bins on [0, 1], recorded on diagnostic steps


@dataclass(frozen=True)
class SiteInfo:
    """Where a site sits in the model; passed to every site's constructor."""

    d_model: int
    index: int  # 0-based sublayer index over the whole model (block b: attention 2b, MLP 2b+1)
    n_sublayers: int
    kind: str  # "attn" or "mlp"
    eps: float
    cfg: RuleKnobs  # the rule's knobs
    # completep's m_L^-alpha for a rule whose composition applies it to what it writes (`Composition.branch =
    # "write"`); 1 otherwise (the model scales the update itself, or there is no multiplier)
    branch_multiplier: float = 1.0

    @property
    def n_blocks(self) -> int:
        return self.n_sublayers // 2


@dataclass(frozen=True)
class StreamInfo:
    d_model: int
    n_sublayers: int
    eps: float
    cfg: RuleKnobs


class Site(nn.Module):
    """The residual merge around one sublayer. Subclasses implement read, write, reset_parameters."""

    #: parameter names (as in named_parameters of this module) excluded from weight decay
    no_decay: tuple[str, ...] = ()
    #: a capability the block asks about: True, the site gives the attention it wraps its q, k and v (`qkv`); the
    #: block then calls `qkv` between `read` and the attention. False (the default): attention projects `x` itself.
    attention_inputs: bool = False

    def __init__(self, info: SiteInfo) -> None:
        super().__init__()
        self.info = info
        self.record = False  # set by the trainer on diagnostic steps
        self.stats: dict[str, torch.Tensor] = {}

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        """Parameters of one site at width d, computed without building it (the rule's analytic formula)."""
        raise NotImplementedError(f"{cls.__qualname__}.count(d, cfg): give the site's parameter count")

    def read(self, state: State) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def write(self, state: State, y: torch.Tensor, ctx: Any) -> State:
        raise NotImplementedError

    def qkv(self, project: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
            x: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """For a site that declares `attention_inputs` (an attention site): the q, k, v (B, T, D) its attention uses,
        and the ctx that `write` then receives. `project(z)` is the attention's own QKV projection of an input z
        (B, T, D) -> (q, k, v); `x` and `ctx` are what `read` returned. A site may project `x` and transform the
        result (value residuals mix v with the first layer's, carried in the state), or project inputs of its own
        (one per q, k, v). The heads are split and rotated after this; a key/value cache keeps what it returns."""
        q, k, v = project(x)
        return q, k, v, ctx

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
    def count(cls, d: int, cfg: RuleKnobs) -> int:
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


Count = Callable[[int, int, RuleKnobs], int]  # (d_model, n_sublayers, cfg) -> all the rule's parameters
# (model) -> the (parameter, fn) pairs the engine sets to fn(parameter) after an optimizer step (`RuleSpec.after_step`)
AfterStep = Callable[[nn.Module], Iterable[tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]]]


@dataclass(frozen=True, kw_only=True)
class RuleSpec:
    """A registered residual rule: how to build it, and how many parameters it adds, without building it.

    `params` defaults to the stream's count plus one site's count per sublayer, each from its `count(d, cfg)`;
    `knobs` are the dataclasses of `model.residual` keys the rule reads: each with a default for every field
    and, optionally, a `check()`. A run's `model.residual` is checked against them (rrtrain.knobs), and the
    rule is built from `make_knobs(...)` of its values.
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
    # the model draws both output projections with GPT-2's depth scaling, std / sqrt(2 * n_blocks); False: with
    # std alone (LayerNorm Scaling, whose 1/sqrt(l) takes the place of that scaling)
    depth_scaled_output_init: bool = True
    # how the rule composes with model.parametrization mup / completep (rrtrain/residuals/composition.py); None:
    # refused under both, in one line naming what to declare
    composition: Optional[Composition] = None
    # training FLOPs per token of the rule's own arithmetic beyond 6 per rule parameter (which the planner counts
    # for every rule, as matmul weights): (d_model, n_sublayers, cfg) -> FLOPs; None: nothing beyond (DenseFormer's
    # weighted sums over earlier outputs give it: 6 per source per width per token)
    flops: Optional[Count] = None
    # the rule's optimizer-side hook: (model) -> the (parameter, fn) pairs the engine sets to fn(parameter) after
    # every optimizer step that changed the weights (none after a skipped step); None: nothing (every rule but nGPT,
    # which puts its matrices back on the unit sphere). fn receives the parameter as the engine holds it: the whole
    # fp32 tensor, or an FSDP2 DTensor shard of dim 0, whose reductions over a sharded dim span the ranks
    after_step: Optional[AfterStep] = None

    def __post_init__(self) -> None:
        if self.params is None:
            object.__setattr__(self, "params", _counted(self.site, self.stream))
        object.__setattr__(self, "knobs", tuple(self.knobs))
        seen: dict[str, type] = {}
        for knobs in self.knobs:
            if not isinstance(knobs, type) or not dataclasses.is_dataclass(knobs):
                raise TypeError(f"residual rule '{self.name}': knobs {knobs!r} must be a dataclass")
            for f in dataclasses.fields(knobs):
                where = f"residual rule '{self.name}': knob {knobs.__qualname__}.{f.name}"
                if f.name in seen:
                    raise ValueError(f"model.residual.{f.name} is declared by both {seen[f.name].__qualname__} and "
                                     f"{knobs.__qualname__} (rule '{self.name}')")
                if f.name in RESERVED_KNOB_NAMES or f.name.startswith("_"):
                    raise ValueError(f"{where}: the name is taken by RuleKnobs itself")
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise TypeError(f"{where} needs a default")
                seen[f.name] = knobs

    def knob_names(self) -> list[str]:
        """The `model.residual` keys this rule reads, in declaration order."""
        return [f.name for knobs in self.knobs for f in dataclasses.fields(knobs)]

    def make_knobs(self, **values: Any) -> RuleKnobs:
        """This rule's knobs from already typed values (defaults for the rest); `rrtrain.knobs` checks user input."""
        return RuleKnobs.of(self.knobs, values)

    def make_site(self, d_model: int, index: int, n_sublayers: int, kind: str, eps: float,
                  knobs: RuleKnobs, branch_multiplier: float = 1.0) -> Site:
        """The site around sublayer `index`: how the model builds one without importing this module."""
        return self.site(SiteInfo(d_model, index, n_sublayers, kind, eps, knobs, branch_multiplier))

    def make_stream(self, d_model: int, n_sublayers: int, eps: float, knobs: RuleKnobs) -> Stream:
        return self.stream(StreamInfo(d_model, n_sublayers, eps, knobs))


def _counted(site: Any, stream: Any) -> Count:
    def params(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
        return stream.count(d, cfg) + n_sublayers * site.count(d, cfg)

    return params


def require(knobs: Any, positive: Iterable[str] = (), non_negative: Iterable[str] = ()) -> None:
    """A knob class's range checks: a one-line KnobError naming `model.residual.<name>`, as config.py words
    its own."""
    for name in positive:
        value = getattr(knobs, name)
        if not value > 0:
            raise KnobError(f"model.residual.{name} must be positive, got {value}")
    for name in non_negative:
        value = getattr(knobs, name)
        if value < 0:
            raise KnobError(f"model.residual.{name} must not be negative, got {value}")

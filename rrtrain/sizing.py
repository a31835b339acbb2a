"""Size presets, analytic parameter and FLOP counts, and parameter matching by widening.

Counts are computed from the shape, never by allocating a model: sweeps size 1B and 70B runs on a laptop.
`tests/unit/rrtrain/model/test_sizing.py` checks every formula here against a model built on the meta device.

A rule is passed as its registry spec (a resolved run holds it: `rrtrain.resolve`), or by name for callers
that hold only a name; the registry is imported only then, so the presets and the counts load without torch
(`rrtrain status` reads a preset's sequence length). Its knobs are passed as the config's `model.residual`
mapping (each rule takes its own keys from it: rrtrain.knobs) or as the rule's own `RuleKnobs`.

This is the config's side of the model (presets, `model.*` keys): the model package (rrtrain/model/) knows
no config, and holds the `ModelShape` this module resolves.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

import yaml

from rrtrain.config import ModelConfig
from rrtrain.core.errors import UsageError
from rrtrain.knobs import rule_knobs
from rrtrain.model.spec import ModelShape

if TYPE_CHECKING:
    from rrtrain.residuals import RuleKnobs, RuleSpec

Rule = Union["RuleSpec", str]  # a registry spec, or a rule's name
Knobs = Union[Mapping[str, Any], "RuleKnobs"]  # `model.residual` as configured, or one rule's own knobs

DEFAULT_VOCAB = 50257


def configs_dir() -> Path:
    """The repository's `configs/` (or $RRTRAIN_CONFIGS)."""
    env = os.environ.get("RRTRAIN_CONFIGS")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "configs"


@dataclass(frozen=True)
class Preset:
    name: str
    nominal_params: Optional[int]
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: Optional[int]
    seq_len: int
    vocab_size: int


@functools.lru_cache(maxsize=None)
def presets() -> dict[str, Preset]:
    out: dict[str, Preset] = {}
    for path in sorted((configs_dir() / "sizes").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        out[data["name"]] = Preset(**data)
    return dict(sorted(out.items(), key=lambda kv: (kv[1].nominal_params or 0, kv[0])))


def resolve_shape(m: ModelConfig, vocab_size: Optional[int] = None) -> ModelShape:
    """Preset values, overridden by whatever the model config sets; checks that the shape is possible."""
    table = presets()
    if m.size not in table:
        import difflib

        close = difflib.get_close_matches(m.size, list(table), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(f"model.size: unknown preset '{m.size}'{hint}; known: {', '.join(table)}")
    p = table[m.size]
    d = m.d_model if m.d_model is not None else p.d_model
    heads = m.n_heads if m.n_heads is not None else p.n_heads
    d_ff = m.d_ff if m.d_ff is not None else (p.d_ff if p.d_ff is not None and m.d_model is None else 4 * d)
    vocab = m.vocab_size if m.vocab_size is not None else (vocab_size or p.vocab_size)
    shape = ModelShape(
        d_model=d,
        n_layers=m.n_layers if m.n_layers is not None else p.n_layers,
        n_heads=heads,
        d_ff=d_ff,
        seq_len=m.seq_len if m.seq_len is not None else p.seq_len,
        vocab_size=vocab,
        pos=m.pos,
    )
    check_shape(shape)
    return shape


def check_shape(shape: ModelShape, key: str = "model.") -> None:
    """What makes a shape a model: every size at least 1, heads that divide the width, an even head size for
    RoPE. `key` prefixes each field's name in the error (a config's `model.`, or the record that holds it)."""
    for name in ("d_model", "n_layers", "n_heads", "d_ff", "seq_len", "vocab_size"):
        if getattr(shape, name) < 1:
            raise UsageError(f"{key}{name} must be at least 1, got {getattr(shape, name)}")
    if shape.d_model % shape.n_heads:
        raise UsageError(f"{key}d_model={shape.d_model} is not divisible by {key}n_heads={shape.n_heads}")
    if shape.pos == "rope" and shape.head_dim % 2:
        raise UsageError(f"{key}pos=rope needs an even head size, got d_model/n_heads={shape.head_dim}")


# ---------------------------------------------------------------------------------------------
# Counting


def backbone_params(s: ModelShape) -> int:
    """Embedding (tied with the LM head), positions, attention and MLP weights; no biases."""
    embed = s.vocab_size * s.d_model
    pos = s.seq_len * s.d_model if s.pos == "learned" else 0
    per_block = 4 * s.d_model * s.d_model + 2 * s.d_model * s.d_ff
    return embed + pos + s.n_layers * per_block


def spec_of(rule: Rule) -> "RuleSpec":
    """The registry's spec: `rule` itself, or the spec registered under that name."""
    if not isinstance(rule, str):
        return rule
    from rrtrain import residuals

    return residuals.get(rule)


def knobs_of(spec: "RuleSpec", cfg: Knobs) -> "RuleKnobs":
    """`spec`'s knobs: `cfg` itself when it is a RuleKnobs, else the rule's keys of the `model.residual` mapping
    (typed and checked, the keys of other rules left alone)."""
    return rule_knobs(spec, cfg) if isinstance(cfg, Mapping) else cfg


def rule_params(s: ModelShape, rule: Rule, cfg: Knobs) -> int:
    """All parameters that belong to the residual rule: norms, gates, stream controllers."""
    spec = spec_of(rule)
    return spec.params(s.d_model, s.n_sublayers, knobs_of(spec, cfg))


def count_params(s: ModelShape, rule: Rule, cfg: Knobs) -> int:
    return backbone_params(s) + rule_params(s, rule, cfg)


def gate_params(s: ModelShape, rule: Rule, cfg: Knobs) -> int:
    """What the rule adds over the standard pre-norm residual at the same shape (which has no knobs)."""
    standard = spec_of("standard")
    return rule_params(s, rule, cfg) - rule_params(s, standard, standard.make_knobs())


def flops_per_token(s: ModelShape, rule: Rule, cfg: Knobs) -> float:
    """Training FLOPs per token: 6 * (non-embedding matmul params + LM head) + attention scores.

    6N counts forward (2N) and backward (4N) for every weight matrix a token passes through
    (the tied embedding matrix is used once as the LM head; the lookup is free). The attention term
    is 12 * n_layers * seq_len * d_model: a token's query meets seq_len keys and values in QK^T and AV (2
    matmuls x 2 FLOPs per multiply-add x seq_len x d_model forward, twice that backward), the causal mask
    not discounted: PaLM's 12·L·H·Q·T (Appendix B), as nanoGPT's estimate_mfu and torchtitan count it, so
    an MFU here compares with theirs. Residual-rule parameters are matmul weights too (gates, controllers);
    norm gains and scalars are counted with them, a negligible overcount. A rule whose own arithmetic is not
    6 per parameter (DenseFormer's weighted sums over earlier outputs) adds it through `RuleSpec.flops`.
    """
    n_matmul = backbone_params(s) - (s.seq_len * s.d_model if s.pos == "learned" else 0)
    n_matmul += rule_params(s, rule, cfg)
    spec = spec_of(rule)
    own = spec.flops(s.d_model, s.n_sublayers, knobs_of(spec, cfg)) if spec.flops is not None else 0
    return 6.0 * n_matmul + own + 12.0 * s.n_layers * s.seq_len * s.d_model


# ---------------------------------------------------------------------------------------------
# Parameter matching


def _with(s: ModelShape, **changes: int) -> ModelShape:
    return dataclasses.replace(s, **changes)


def match_shape(s: ModelShape, rule: Rule, cfg: Knobs, target: int, widen: str = "mlp",
                tolerance: float = 0.005) -> ModelShape:
    """Widen `rule` at shape `s` until its count is within `tolerance` of `target`.

    widen=mlp: change d_ff only (the paper's "parameter-matched by widening"). widen=model: grow d_model by
    whole heads (head size kept), d_ff = 4 * d_model, as far as it stays at or under the target, then close
    the rest of the gap with d_ff. A variant already larger than the target is narrowed the same way.
    """
    spec = spec_of(rule)
    variant = spec.name
    knobs = knobs_of(spec, cfg)

    def count(shape: ModelShape) -> int:
        return count_params(shape, spec, knobs)

    if widen == "model":
        head = s.head_dim
        best = s
        heads = s.n_heads
        while True:
            cand = _with(s, d_model=(heads + 1) * head, n_heads=heads + 1, d_ff=4 * (heads + 1) * head)
            if count(cand) > target:
                break
            best, heads = cand, heads + 1
        while count(best) > target and best.n_heads > 1:
            heads = best.n_heads - 1
            best = _with(s, d_model=heads * head, n_heads=heads, d_ff=4 * heads * head)
        s = best
    # d_ff enters linearly: 2 * d_model * n_layers parameters per unit.
    per_unit = 2 * s.d_model * s.n_layers
    d_ff = s.d_ff + round((target - count(s)) / per_unit)
    if d_ff < 1:
        raise UsageError(f"cannot match {variant} to {target:,} parameters by widening: it is larger even with d_ff=1")
    matched = _with(s, d_ff=d_ff)
    if abs(count(matched) - target) > tolerance * target:
        raise UsageError(f"cannot match {variant} to within {tolerance:.2%} of {target:,} parameters")
    return matched


@dataclass(frozen=True)
class SizedModel:
    variant: str
    shape: ModelShape
    params: int
    gate_params: int


def size_variants(m: ModelConfig, variants: list[str], reference: Optional[str] = None, widen: str = "mlp",
                  tolerance: float = 0.005, vocab_size: Optional[int] = None) -> dict[str, SizedModel]:
    """Shapes and counts for several variants at one size; with `reference`, the others are matched to it."""
    base = resolve_shape(m, vocab_size)
    cfg = m.residual
    target = count_params(base, reference, cfg) if reference else None
    out: dict[str, SizedModel] = {}
    for name in variants:
        spec = spec_of(name)  # once per rule
        knobs = knobs_of(spec, cfg)
        shape = base
        if target is not None and name != reference:
            shape = match_shape(base, spec, knobs, target, widen, tolerance)
        out[name] = SizedModel(name, shape, count_params(shape, spec, knobs), gate_params(shape, spec, knobs))
    return out

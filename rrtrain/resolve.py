"""A config resolved once: the residual rule's spec, the shape, the counts, the budget and the dataset's manifest.

`rrtrain.config` knows the schema only and imports neither `rrtrain.residuals` nor `rrtrain.model.sizing` (both
import it: checking against them there made an import circle). Everything that needs them is worked out here,
one layer up, into one frozen `ResolvedRun` that the trainer, `rrtrain bench`, `rrtrain plan` and the sweep's
estimates consume instead of working the run out again: the variant's name is looked up in the registry once,
here, and the model, the counts and the planner take the spec.

`load` is `load_config` plus the same checks without the dataset (an unknown rule or preset, an impossible
shape), so that every command that loads a config refuses it in one line before any expensive work.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from rrtrain import residuals
from rrtrain.budget import Budget, budget
from rrtrain.config import Config, load_config
from rrtrain.core.errors import UsageError
from rrtrain.model import sizing
from rrtrain.residuals import RuleSpec


@dataclass(frozen=True)
class ResolvedRun:
    """One run as every consumer sees it. Frozen: a consumer that needs another figure asks `resolve` again."""

    cfg: Config
    rule: RuleSpec  # the registry's spec of `cfg.model.variant`
    shape: sizing.ModelShape  # preset + overrides, the dataset's vocabulary and seq_len, matched when asked
    params: int
    flops_per_token: float
    budget: Optional[Budget]  # None: the config sets no budget (bench and plan need none)
    manifest: Optional[Mapping[str, Any]]  # the dataset's manifest; None: no dataset, or not prepared yet

    @property
    def total_steps(self) -> Optional[int]:
        return self.budget.total_steps if self.budget else None

    @property
    def warmup_steps(self) -> Optional[int]:
        return self.budget.warmup_steps if self.budget else None

    @property
    def tokens(self) -> Optional[int]:
        """The token budget (max_steps x global_batch x seq_len, else train.tokens)."""
        return self.budget.tokens if self.budget else None


def _unknown(name: str, key: Optional[str]) -> str:
    known = residuals.names()
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    what = f"{key}: unknown residual rule" if key else "unknown variant"
    return f"{what} '{name}'{hint}; known: {', '.join(known)}"


def check_rule(name: str, key: Optional[str] = None) -> None:
    """Refuse a name the registry does not know, naming the closest rule and every known one. `key` is where
    the name was given (`model.variant`, `sizes.tiny.variants`); `rrtrain params` flags give none."""
    if name not in residuals.names():
        raise UsageError(_unknown(name, key))


def rule_named(name: str, key: Optional[str] = None) -> RuleSpec:
    """The registry's spec for `name`, refused as `check_rule` refuses it."""
    check_rule(name, key)
    return residuals.get(name)


def check_model(cfg: Config) -> None:
    """Reject an unknown variant or reference rule, an unknown size preset or an impossible shape, before any
    work (no dataset is read: `resolve` checks the shape against it)."""
    check_rule(cfg.model.variant, "model.variant")
    if cfg.match.reference is not None:
        check_rule(cfg.match.reference, "match.reference")
    sizing.resolve_shape(cfg.model)  # checks the preset name and the shape


def resolve_model_shape(cfg: Config, data_vocab: Optional[int], data_seq_len: Optional[int],
                        rule: Optional[RuleSpec] = None) -> sizing.ModelShape:
    """The model's shape: preset + overrides, the dataset's vocabulary and sequence length unless set,
    widened to the reference variant's parameter count when `match.reference` is set."""
    m = cfg.model
    if data_seq_len is not None and m.seq_len is not None and m.seq_len != data_seq_len:
        raise UsageError(f"model.seq_len={m.seq_len} but the dataset was packed with seq_len={data_seq_len}")
    base = sizing.resolve_shape(m, data_vocab)
    if data_seq_len is not None:
        base = dataclasses.replace(base, seq_len=data_seq_len)
    if data_vocab is not None and base.vocab_size < data_vocab:
        raise UsageError(f"dataset vocabulary {data_vocab} does not fit the model's vocab_size {base.vocab_size}")
    ref = cfg.match.reference
    if ref is None or ref == m.variant:
        return base
    target = sizing.count_params(base, rule_named(ref, "match.reference"), m.residual)
    rule = rule or rule_named(m.variant, "model.variant")
    return sizing.match_shape(base, rule, m.residual, target, cfg.match.widen, cfg.match.tolerance)


def resolve(cfg: Config, manifest: Optional[Mapping[str, Any]] = None,
            seq_len: Optional[int] = None) -> ResolvedRun:
    """Resolve `cfg` against the registry, the presets and the dataset's `manifest` (None: none, or not prepared
    yet; `seq_len` then stands in for the dataset's, e.g. a sweep's own `prep.seq_len`)."""
    rule = rule_named(cfg.model.variant, "model.variant")
    if cfg.match.reference is not None:
        check_rule(cfg.match.reference, "match.reference")
    vocab = manifest["vocab_size"] if manifest is not None else None
    data_seq_len = manifest["seq_len"] if manifest is not None else seq_len
    shape = resolve_model_shape(cfg, vocab, data_seq_len, rule)
    r = cfg.model.residual
    return ResolvedRun(cfg=cfg, rule=rule, shape=shape, params=sizing.count_params(shape, rule, r),
                       flops_per_token=sizing.flops_per_token(shape, rule, r),
                       budget=budget(cfg.train, shape.seq_len), manifest=manifest)


def load(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """`rrtrain.config.load_config`, then `check_model`: a config ready to resolve and build a model from."""
    cfg = load_config(path, overrides)
    check_model(cfg)
    return cfg

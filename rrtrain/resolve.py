"""A config resolved once: the residual rule's spec and knobs, the shape, the counts, the budget and the
dataset's manifest.

`rrtrain.config` knows the schema only and imports neither `rrtrain.residuals` nor `rrtrain.sizing`, and the
model package (rrtrain/model/, rrtrain/residuals/) knows no config. Everything that joins them is worked out
here, into one frozen `ResolvedRun` that the trainer, `rrtrain bench`, `rrtrain plan` and the sweep's estimates
consume instead of working the run out again: the variant's name is looked up in the registry once, here,
`model.residual` is checked against that rule's knobs (rrtrain.knobs), and the model is built from the
`ModelSpec` made here.

`load` is `load_config` plus the same checks without the dataset (an unknown rule, knob or preset, an
impossible shape), so that every command that loads a config refuses it in one line before any expensive work.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from rrtrain import residuals, sizing
from rrtrain.budget import Budget, budget
from rrtrain.config import Config, ModelConfig, load_config
from rrtrain.config_load import build
from rrtrain.core.errors import UsageError
from rrtrain.knobs import resolve_residual, rule_knobs
from rrtrain.model.parametrization import SP, Parametrization, refusal as parametrization_refusal
from rrtrain.model.spec import ModelShape, ModelSpec
from rrtrain.residuals import RuleKnobs, RuleSpec

if TYPE_CHECKING:
    import torch

    from rrtrain.model.transformer import Transformer


@dataclass(frozen=True)
class ResolvedRun:
    """One run as every consumer sees it. Frozen: a consumer that needs another figure asks `resolve` again."""

    cfg: Config  # `model.residual` holding every knob of the rules it names (`rules_in_play`), typed
    rule: RuleSpec  # the registry's spec of `cfg.model.variant`
    shape: sizing.ModelShape  # preset + overrides, the dataset's vocabulary and seq_len, matched when asked
    params: int
    flops_per_token: float
    budget: Optional[Budget]  # None: the config sets no budget (bench and plan need none)
    manifest: Optional[Mapping[str, Any]]  # the dataset's manifest; None: no dataset, or not prepared yet

    @property
    def knobs(self) -> RuleKnobs:
        """The rule's own knobs, from `cfg.model.residual`."""
        return rule_knobs(self.rule, self.cfg.model.residual)

    @property
    def model_spec(self) -> ModelSpec:
        """What the model is built from (rrtrain.model.transformer.build_model)."""
        return spec_of_model(self.cfg.model, self.shape, self.rule, self.knobs)

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


def rules_in_play(cfg: Config) -> list[RuleSpec]:
    """The rules `model.residual` serves: the variant's, and the reference's (its count uses the same section)."""
    rules = [rule_named(cfg.model.variant, "model.variant")]
    ref = cfg.match.reference
    if ref is not None and ref != cfg.model.variant:
        rules.append(rule_named(ref, "match.reference"))
    return rules


def with_knobs(cfg: Config, rules: Optional[list[RuleSpec]] = None) -> Config:
    """`cfg` with `model.residual` checked against the rules it serves (`rules`, else `rules_in_play`) and
    written out in full (every knob of those rules, typed): what config.yaml records and a resume compares."""
    residual = resolve_residual(cfg.model.residual, rules or rules_in_play(cfg))
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, residual=residual))


def check_model(cfg: Config) -> None:
    """Reject an unknown variant or reference rule, a `model.residual` key neither rule has (or a value of the
    wrong type or range), an unknown size preset or an impossible shape, before any work (no dataset is read:
    `resolve` checks the shape against it)."""
    with_knobs(cfg)
    sizing.resolve_shape(cfg.model)  # checks the preset name and the shape
    check_doc_mask(cfg.model)
    check_parametrization(cfg.model)


def parametrization_of(m: ModelConfig) -> Parametrization:
    """`model.parametrization` with its base shape (None: the tiny preset's) and alpha; one line when impossible."""
    if m.parametrization == "sp":
        return SP
    tiny = sizing.presets()["tiny"]
    try:
        return Parametrization(m.parametrization, m.base_d_model or tiny.d_model, m.base_n_layers or tiny.n_layers,
                               m.alpha)
    except ValueError as err:
        raise UsageError(str(err)) from None


def check_parametrization(m: ModelConfig) -> None:
    """Refuse, in one line, a parametrization the variant's rule does not declare a composition for
    (rrtrain/residuals/composition.py), or completep for a rule that is a depth scheme of its own."""
    why = parametrization_refusal(parametrization_of(m), rule_named(m.variant, "model.variant"))
    if why:
        raise UsageError(why)


def check_doc_mask(m: ModelConfig) -> None:
    """Document-masking keys that mean nothing without `model.doc_mask`, or an impossible token id: one line."""
    if not m.doc_mask:
        given = [f"model.{k}={getattr(m, k)}" for k in ("doc_positions", "eod_id") if getattr(m, k) is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} only apply with model.doc_mask=true (document masking is off)")
    if m.eod_id is not None and m.eod_id < 0:
        raise UsageError(f"model.eod_id must be a token id (0 or more), got {m.eod_id}")


def with_eod(cfg: Config, manifest: Optional[Mapping[str, Any]], vocab_size: int) -> Config:
    """`cfg` with `model.eod_id` the dataset's end-of-document token when `model.doc_mask` is on (the manifest's
    `eos_id`, as the vocabulary comes from it): recorded in config.yaml, so the run's model rebuilds alike."""
    m = cfg.model
    if not m.doc_mask:
        return cfg
    eos = manifest["eos_id"] if manifest is not None else None
    if m.eod_id is not None and eos is not None and m.eod_id != eos:
        raise UsageError(f"model.eod_id={m.eod_id} but the dataset ends its documents with token {eos} (its "
                         "manifest's eos_id); leave model.eod_id unset")
    eod = m.eod_id if m.eod_id is not None else eos
    if eod is not None and eod >= vocab_size:
        raise UsageError(f"model.eod_id={eod} is not a token of the model's vocabulary of {vocab_size}")
    return cfg if eod == m.eod_id else dataclasses.replace(cfg, model=dataclasses.replace(m, eod_id=eod))


def resolve_model_shape(cfg: Config, data_vocab: Optional[int], data_seq_len: Optional[int],
                        rule: Optional[RuleSpec] = None, reference: Optional[RuleSpec] = None) -> sizing.ModelShape:
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
    target = sizing.count_params(base, reference or rule_named(ref, "match.reference"), m.residual)
    rule = rule or rule_named(m.variant, "model.variant")
    return sizing.match_shape(base, rule, m.residual, target, cfg.match.widen, cfg.match.tolerance)


def resolve(cfg: Config, manifest: Optional[Mapping[str, Any]] = None,
            seq_len: Optional[int] = None) -> ResolvedRun:
    """Resolve `cfg` against the registry, the presets and the dataset's `manifest` (None: none, or not prepared
    yet; `seq_len` then stands in for the dataset's, e.g. a sweep's own `prep.seq_len`). The run's config has
    `model.residual` written out in full (`with_knobs`)."""
    rules = rules_in_play(cfg)  # the registry asked once per rule
    cfg = with_knobs(cfg, rules)
    rule = rules[0]
    vocab = manifest["vocab_size"] if manifest is not None else None
    data_seq_len = manifest["seq_len"] if manifest is not None else seq_len
    shape = resolve_model_shape(cfg, vocab, data_seq_len, rule, rules[-1])
    cfg = with_eod(cfg, manifest, shape.vocab_size)
    knobs = rule_knobs(rule, cfg.model.residual)
    return ResolvedRun(cfg=cfg, rule=rule, shape=shape, params=sizing.count_params(shape, rule, knobs),
                       flops_per_token=sizing.flops_per_token(shape, rule, knobs),
                       budget=budget(cfg.train, shape.seq_len), manifest=manifest)


def spec_of_model(m: ModelConfig, shape: ModelShape, rule: RuleSpec, knobs: RuleKnobs) -> ModelSpec:
    return ModelSpec(shape=shape, rule=rule, knobs=knobs, norm_eps=m.norm_eps, init_std=m.init_std,
                     rope_base=m.rope_base, doc_mask=m.doc_mask, doc_positions=m.doc_positions or "restart",
                     eod_id=m.eod_id, parametrization=parametrization_of(m))


def model_spec(m: ModelConfig, vocab_size: Optional[int] = None, shape: Optional[ModelShape] = None,
               rule: Optional[RuleSpec] = None) -> ModelSpec:
    """The model-side description of a config's model section: its shape (`shape`, else the preset's with the
    section's overrides), its rule (`rule`, else the registry's spec of `m.variant`) and that rule's knobs from
    `m.residual` (keys of other rules are left alone here: `check_model` is where a run's config is held to its
    rules)."""
    rule = rule or rule_named(m.variant, "model.variant")
    return spec_of_model(m, shape or sizing.resolve_shape(m, vocab_size), rule, rule_knobs(rule, m.residual))


def build_model(m: ModelConfig, vocab_size: Optional[int] = None, device: "torch.device | str | None" = None,
                shape: Optional[ModelShape] = None, seed: Optional[int] = 0,
                rule: Optional[RuleSpec] = None) -> "Transformer":
    """The model a config section describes (`model_spec`), initialised from `seed`; `device="meta"` builds
    without allocating or initialising (training's path: rrtrain.parallel.materialize)."""
    from rrtrain.model import transformer  # torch: only when a model is built

    if m.doc_mask and m.eod_id is None:
        raise UsageError("model.doc_mask needs the end-of-document token id: give the run its data.path (whose "
                         "manifest names it) or set model.eod_id")
    return transformer.build_model(model_spec(m, vocab_size, shape, rule), device=device, seed=seed)


def build_config(data: Mapping[str, Any]) -> Config:
    """`build(Config, data)` with each `model.residual` value typed as the knob of that name types it: the
    variant's or the reference's rule's, else any registered rule's that has it (a sweep's grid types
    `model.residual.gate_bias: [-1, 0.5]` before its runs have a variant: -1.0 and 0.5, as the runs will read
    them). Nothing is refused here that `build` accepts: `check_model` holds the section to its rules."""
    cfg = build(Config, dict(data))
    named = [n for n in (cfg.model.variant, cfg.match.reference) if n in residuals.names()]
    order = [residuals.get(n) for n in dict.fromkeys([*named, *residuals.names()])]
    typed = {}
    for key, value in cfg.model.residual.items():
        knobs = next((k for rule in order for k in rule.knobs if key in k.__dataclass_fields__), None)
        typed[key] = value if knobs is None else getattr(build(knobs, {key: value}, "model.residual"), key)
    cfg.model.residual = typed
    return cfg


def load(path: str | Path | None, overrides: list[str] | None = None, sha256: Optional[str] = None) -> Config:
    """`rrtrain.config.load_config`, then `check_model`: a config ready to resolve and build a model from."""
    cfg = load_config(path, overrides, sha256)
    check_model(cfg)
    return cfg

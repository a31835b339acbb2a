"""`model.residual`: a plain mapping in the config, checked here against the knobs of the rules a run names.

A rule declares its knobs itself (`RuleSpec.knobs`: dataclasses with defaults and a `check()`), so a rule from
another package brings its own keys. The keys of `model.residual` must each be a knob of one of the rules the
config names (`model.variant`, and `match.reference`, whose count is worked out with the same section): a knob
of other rules is refused naming them, any other key naming the closest knob; a wrong type says what was
expected (rrtrain.config's own coercion, so `model.residual.gate_bias=-2` reads as the float it is), and each
knob class's `check()` runs (its KnobError becomes the usage error: the model package does not know rrtrain's).
`rrtrain.resolve` writes the result back into the config, every knob of those rules spelled out, so that
config.yaml records what the model was built with and a resume compares like with like.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import TYPE_CHECKING, Any, Mapping

from rrtrain.config import Config
from rrtrain.config_load import build
from rrtrain.core.errors import UsageError

if TYPE_CHECKING:
    from rrtrain.residuals import RuleKnobs, RuleSpec

KEY = "model.residual"


def _rules(names: list[str]) -> str:
    return ("rule " if len(names) == 1 else "rules ") + ", ".join(f"'{n}'" for n in names)


def check_keys(values: Mapping[str, Any], specs: list["RuleSpec"], key: str = KEY) -> None:
    """Every key of `values` is a knob of one of `specs`; the first that is not is refused in one line: a knob
    of other registered rules names them, any other key the closest knob (of `specs`, else of any rule)."""
    from rrtrain import residuals

    if not isinstance(values, Mapping):
        raise UsageError(f"{key}: expected a mapping of knobs, got {values!r}")
    known = list(dict.fromkeys(name for spec in specs for name in spec.knob_names()))
    unknown = [name for name in values if name not in known]
    if not unknown:
        return
    name, names = unknown[0], [s.name for s in specs]
    ours = f"{_rules(names)}: {', '.join(known) or 'none'}"
    owners: dict[str, list[str]] = {}
    for rule in residuals.names():
        for knob in residuals.get(rule).knob_names():
            owners.setdefault(knob, []).append(rule)
    if name in owners:
        raise UsageError(f"'{key}.{name}' is a knob of {_rules(owners[name])}, not of "
                         f"{', '.join(repr(n) for n in names)} (the knobs of {ours})")
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
    close = close or difflib.get_close_matches(str(name), list(owners), n=1, cutoff=0.5)
    whose = f" (a knob of {_rules(owners[close[0]])})" if close and close[0] not in known else ""
    hint = f"; did you mean '{key}.{close[0]}'{whose}?" if close else ""
    raise UsageError(f"unknown key '{key}.{name}'{hint} (the knobs of {ours})")


def rule_knobs(spec: "RuleSpec", values: Mapping[str, Any], key: str = KEY) -> "RuleKnobs":
    """`spec`'s knobs from the `model.residual` mapping: its own keys typed as its knob classes type them (the
    config's coercion: a one-line error naming the key), its defaults for the rest, each class's `check()` run.
    Keys of other rules are not this rule's business (`check_keys` refuses the ones no rule in play has)."""
    from rrtrain.residuals import KnobError, RuleKnobs

    if not isinstance(values, Mapping):
        raise UsageError(f"{key}: expected a mapping of knobs, got {values!r}")
    parts = []
    for knobs in spec.knobs:
        own = {f: values[f] for f in knobs.__dataclass_fields__ if f in values}
        parts.append(build(knobs, own, key))
    result = RuleKnobs(parts)
    try:
        result.check()
    except KnobError as err:
        raise UsageError(str(err)) from None
    return result


def resolve_residual(values: Mapping[str, Any], specs: list["RuleSpec"], key: str = KEY) -> dict[str, Any]:
    """The section as a run records it: every knob of `specs` (the first rule's value wins where two rules share
    a name), each typed and checked."""
    check_keys(values, specs, key)
    out: dict[str, Any] = {}
    for spec in reversed(specs):
        out.update(rule_knobs(spec, values, key).values())
    order = [name for spec in specs for name in spec.knob_names()]
    return {name: out[name] for name in dict.fromkeys(order)}


def drop_other_rules_knobs(cfg: Config, specs: list["RuleSpec"]) -> Config:
    """`cfg` without the `model.residual` keys that only registered rules other than `specs` have: rrtrain
    before per-rule knobs recorded every registered rule's knobs in each run's config.yaml, and such a run
    still loads (to export or evaluate it). A key that no registered rule has is kept, to be refused."""
    from rrtrain import residuals

    ours = {name for spec in specs for name in spec.knob_names()}
    others = {name for n in residuals.names() for name in residuals.get(n).knob_names()} - ours
    kept = {k: v for k, v in cfg.model.residual.items() if k not in others}
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, residual=kept))

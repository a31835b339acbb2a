"""Registry of residual rules by name. A run's rule is looked up here once (rrtrain.resolve); the model is
given the spec and never branches on a name.

The built-in rules are listed in `builtin.py`; a rule from another package is found through the entry-point
group `rrtrain.residuals` (docs/residuals.md, "Your own rule"): each entry names a `RuleSpec`, or a module
with `SPEC` (one rule) or `SPECS` (several). Each rule brings its own knobs (`RuleSpec.knobs`): a run's
`model.residual` is checked against its rule's (rrtrain.knobs), nothing is declared anywhere else.
"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from .base import KnobError, RuleKnobs, RuleSpec, Site, SiteInfo, State, Stream, StreamInfo, require
from .composition import Composition
from .builtin import SPECS as BUILTIN

ENTRY_POINT_GROUP = "rrtrain.residuals"

_RULES: dict[str, RuleSpec] = {}


def register(spec: RuleSpec) -> RuleSpec:
    """Add a rule; a second rule of the same name is refused."""
    if not isinstance(spec, RuleSpec):
        raise TypeError(f"a residual rule is registered as a RuleSpec, got {type(spec).__name__}")
    if spec.name in _RULES:
        raise ValueError(f"residual rule '{spec.name}' registered twice")
    _RULES[spec.name] = spec
    return spec


def get(name: str) -> RuleSpec:
    try:
        return _RULES[name]
    except KeyError:
        raise KeyError(f"unknown residual rule '{name}'; known: {', '.join(names())}") from None


def names() -> list[str]:
    return list(_RULES)


def specs_of(obj: Any) -> list[RuleSpec]:
    """The rules an entry point (or a built-in module) provides: a RuleSpec, or a module's SPEC / SPECS."""
    if isinstance(obj, RuleSpec):
        return [obj]
    if isinstance(obj, ModuleType):
        if hasattr(obj, "SPECS"):
            return list(obj.SPECS)
        if hasattr(obj, "SPEC"):
            return [obj.SPEC]
    raise TypeError(f"expected a RuleSpec or a module with SPEC or SPECS, got {obj!r}")


def discover(group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Register the rules of installed packages; returns their names. A package whose rule cannot be loaded
    is skipped with a warning naming it, so one broken plugin does not stop every command."""
    found = []
    for ep in entry_points(group=group):
        try:
            for spec in specs_of(ep.load()):
                register(spec)
                found.append(spec.name)
        except Exception as err:  # third-party code: any failure to import or register it
            warnings.warn(f"residual rule entry point '{ep.name} = {ep.value}' skipped: "
                          f"{type(err).__name__}: {err}", stacklevel=2)
    return found


for _spec in BUILTIN:
    register(_spec)

discover()

__all__ = ["BUILTIN", "Composition", "ENTRY_POINT_GROUP", "KnobError", "RuleKnobs", "RuleSpec", "Site", "SiteInfo", "State", "Stream",
           "StreamInfo", "discover", "get", "names", "register", "require", "specs_of"]

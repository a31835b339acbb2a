"""A configuration checked against the model registry: residual rules and size presets.

`rrtrain.config` knows the schema only and imports neither `rrtrain.residuals` nor `rrtrain.model.sizing` (both
import it: checking against them there made an import circle). The checks that need them run here, one layer
up, with the same one-line errors: every command that loads a config for use calls `load`, or `check_model`
after `build` + `validate`, before any expensive work.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Optional

from rrtrain import residuals

from rrtrain.model import sizing
from rrtrain.config import Config, load_config
from rrtrain.core.errors import UsageError


def _unknown_rule(key: str, name: str) -> Optional[str]:
    """The one-line complaint about residual rule `name` at `key`, or None when the registry knows it."""
    known = residuals.names()
    if name in known:
        return None
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{key}: unknown residual rule '{name}'{hint}"


def check_model(cfg: Config) -> None:
    """Reject an unknown variant or reference rule, an unknown size preset or an impossible shape."""
    problem = _unknown_rule("model.variant", cfg.model.variant)
    if problem:
        raise UsageError(f"{problem}; known: {', '.join(residuals.names())}")
    if cfg.match.reference is not None:
        problem = _unknown_rule("match.reference", cfg.match.reference)
        if problem:
            raise UsageError(problem)
    sizing.resolve_shape(cfg.model)  # checks the preset name and the shape


def load(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """`rrtrain.config.load_config`, then `check_model`: a config ready to build a model from."""
    cfg = load_config(path, overrides)
    check_model(cfg)
    return cfg

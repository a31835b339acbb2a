"""A grid point: the setting of a sweep's `grid:` keys one run trained at (`{"train.lr": 0.003}`).

The sweep records it in the run's resolved config (`run.point`) and in `sweep.json`, so that `rrtrain status`,
`rrtrain report` and the dashboard name a run's point without the sweep file. The id fragment (`lr3e-3`) is a
function of the point alone: adding values to a grid never renames the runs already there.
"""

from __future__ import annotations

import math
import re
from typing import Any

from rrtrain.core.errors import UsageError
from rrtrain.rundir import fields

#: what an encoded value may contain (it ends up in directory names, job names and shell scripts)
TOKEN = re.compile(r"[A-Za-z0-9._+]+")
#: a grid key as a point may record it: a dotted config key (its last part starts every id fragment)
KEY = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+")


def encode_value(value: Any) -> str:
    """A value in safe characters, short and stable: 0.003 -> `3e-3`, 0.5 -> `0.5`, 10 -> `10`, True -> `true`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UsageError(f"grid value {value!r} is not a finite number")
        if value == 0 or 0.1 <= abs(value) < 1e5:
            return repr(value)
        mantissa, exp = f"{value:.15e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        m = repr(float(mantissa)).removesuffix(".0")
        return f"{m}e{int(exp)}"
    text = str(value)
    if not TOKEN.fullmatch(text):  # fullmatch: `$` would let a final newline through
        raise UsageError(f"grid value {text!r} cannot be part of a run id: use letters, digits and ._+ only")
    return text


def short_name(key: str) -> str:
    """The key's last part: `train.lr` -> `lr`."""
    return key.rpartition(".")[2]


def point_key(point: dict[str, Any]) -> str:
    """The run-id fragment of a point: one `NAMEVALUE` token per key, keys sorted, joined by `-`
    (`lr3e-3-warmup_steps10`); empty for no grid."""
    return "-".join(f"{short_name(k)}{encode_value(point[k])}" for k in sorted(point))


def point_label(point: dict[str, Any]) -> str:
    """A point for people: `train.lr=0.003 train.warmup_steps=10`; `-` for no grid."""
    return " ".join(f"{k}={point[k]!r}" if isinstance(point[k], str) else f"{k}={point[k]}"
                    for k in sorted(point)) or "-"


def read_point(config: Any) -> dict[str, Any]:
    """The point recorded in a resolved config (`run.point`), as untrusted data: {} when absent or malformed;
    only dotted config keys with scalar values that encode in safe characters are kept (a point names
    directories of the dashboard's logdir)."""
    raw = fields.dig(config, "run", "point")
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and KEY.fullmatch(k) and _encodes(v)}


def _encodes(value: Any) -> bool:
    if not isinstance(value, (str, int, float, bool)) or (isinstance(value, int) and abs(value) > fields.INT_MAX):
        return False
    try:
        encode_value(value)
    except UsageError:
        return False
    return True

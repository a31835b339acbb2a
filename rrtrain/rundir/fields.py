"""Typed reads of single values from files another process (or another tool, or a crash) wrote.

Each returns the value in the type asked for, or None when it is missing or of another type: a reader of a run
directory never trusts what it finds there, and a wrong type costs that one field, not the whole file.
`bool` is never a number here (JSON `true` is not a step).
"""

from __future__ import annotations

import math
from typing import Any, Optional


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def number(v: Any) -> Optional[float]:
    return float(v) if is_number(v) else None


def finite(v: Any) -> Optional[float]:
    x = number(v)
    return x if x is not None and math.isfinite(x) else None


def integer(v: Any) -> Optional[int]:
    """An int, an integral float (3.0) or a string of digits; anything else (3.5, "x", true) is None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def step(v: Any) -> Optional[int]:
    """A step number as a metrics line carries it: an int or an integral float; never a string or a bool."""
    return None if isinstance(v, str) else integer(v)


def text(v: Any) -> Optional[str]:
    """A scalar as text; None for missing, empty, lists and objects."""
    return str(v) if v not in (None, "") and not isinstance(v, (dict, list)) else None


def texts(v: Any) -> tuple[str, ...]:
    """A list of names (flags); a value that is not a list gives none, and non-scalar items are dropped."""
    if not isinstance(v, list):
        return ()
    return tuple(t for t in (text(x) for x in v) if t is not None)


def text_map(v: Any) -> dict[str, str]:
    """An object of name -> text (flag details); anything else gives an empty map."""
    if not isinstance(v, dict):
        return {}
    return {str(k): str(x) for k, x in v.items() if x is not None}


def dig(d: Any, *keys: str) -> Any:
    """`d[k1][k2]...`, or None where a level is missing or not an object."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d

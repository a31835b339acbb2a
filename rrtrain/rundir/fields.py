"""Typed reads of single values from files another process (or another tool, or a crash) wrote.

Each returns the value in the type asked for, or None when it is missing or of another type: a reader of a run
directory never trusts what it finds there, and a wrong type costs that one field, not the whole file.
`bool` is never a number here (JSON `true` is not a step). Ranges are part of the type: an integer is one a
64-bit counter holds (a step of 10**30 is not a step), a loss one a cross-entropy can be.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: the largest integer a reader accepts (steps, tokens, seeds, ranks): what numpy's int64 and TensorBoard hold
INT_MAX = 2**63 - 1
_DIGITS = re.compile(r"\s*-?[0-9]{1,19}\s*")  # ASCII digits only: str.isdigit admits '²'
#: a cross-entropy in nats is never negative, and one beyond this is not a loss rrtrain wrote
LOSS_MAX = 1e9
#: a parameter count beyond this (a thousand trillion) is not a model rrtrain trained
COUNT_MAX = 1e15


def number(v: Any) -> Optional[float]:
    """A float, or None; an int too large for a float (10**400) is None, not an OverflowError."""
    if not is_number(v):
        return None
    try:
        return float(v)
    except OverflowError:
        return None


def finite(v: Any) -> Optional[float]:
    x = number(v)
    return x if x is not None and math.isfinite(x) else None


def bounded(v: Any, lo: float, hi: float) -> Optional[float]:
    """A finite number in [lo, hi], or None."""
    x = finite(v)
    return x if x is not None and lo <= x <= hi else None


def loss(v: Any) -> Optional[float]:
    """A loss as rrtrain writes one: finite, in [0, LOSS_MAX]; anything else is None."""
    return bounded(v, 0.0, LOSS_MAX)


def integer(v: Any) -> Optional[int]:
    """An int, an integral float (3.0) or a string of at most 19 digits, within +-INT_MAX; anything else (3.5,
    "x", true, 10**30) is None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    elif isinstance(v, str) and _DIGITS.fullmatch(v):
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return v if -INT_MAX <= v <= INT_MAX else None
    return None


def count(v: Any) -> Optional[int]:
    """A non-negative integer (a step, a token count, an exit status's worth of counting), or None."""
    n = integer(v)
    return n if n is not None and n >= 0 else None


def step(v: Any) -> Optional[int]:
    """A step number as a metrics line carries it: an int or an integral float; never a string or a bool."""
    return None if isinstance(v, str) else integer(v)


def text(v: Any) -> Optional[str]:
    """A scalar as text; None for missing, empty, lists and objects (and an int too long to print)."""
    if v in (None, "") or isinstance(v, (dict, list)):
        return None
    try:
        return str(v)
    except ValueError:  # an int of more than 4300 digits
        return None


def texts(v: Any) -> tuple[str, ...]:
    """A list of names (flags); a value that is not a list gives none, and non-scalar items are dropped."""
    if not isinstance(v, list):
        return ()
    return tuple(t for t in (text(x) for x in v) if t is not None)


def text_map(v: Any) -> dict[str, str]:
    """An object of name -> text (flag details); anything else gives an empty map."""
    if not isinstance(v, dict):
        return {}
    return {str(k): t for k, t in ((k, text(x)) for k, x in v.items()) if t is not None}


def dig(d: Any, *keys: str) -> Any:
    """`d[k1][k2]...`, or None where a level is missing or not an object."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def data_sources(config: Any) -> list[tuple[str, float]]:
    """The prepared datasets a run's recorded config trains on, each with its weight: `data.path` alone (weight
    1), or each of a mixture's `data.sources` (a path and a finite weight > 0); none where the config says
    neither in a usable form (a mixture with one unusable entry included). The paths are text from a file: the
    caller reads them as untrusted."""
    path = dig(config, "data", "path")
    if isinstance(path, str) and path and "\0" not in path:
        return [(path, 1.0)]
    sources = dig(config, "data", "sources")
    out = []
    for source in sources if isinstance(sources, list) else []:
        p, w = dig(source, "path"), finite(dig(source, "weight"))
        if not (isinstance(p, str) and p and "\0" not in p and w is not None and w > 0):
            return []  # one unusable entry: the mixture cannot be told (its weights would be wrong)
        out.append((p, w))
    return out


def short(v: Any, limit: int = 40) -> str:
    """`repr(v)` cut to `limit` characters, for a message; never raises (an int of 5000 digits has no repr)."""
    try:
        r = repr(v)
    except (ValueError, RecursionError):
        r = f"<{type(v).__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."

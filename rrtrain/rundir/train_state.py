"""Reading a checkpoint's `train_state.json` back: the counters, the loader position and the config a resume
continues from. The file sits in a run directory on a shared file system, so it is checked before the trainer
takes a field from it: each field's type and range, and no integer beyond 64 bits anywhere (a message that
printed one would itself fail). A file that fails is `BadTrainState` (a ValueError naming the file and the
field): the checkpoint manager passes over that checkpoint as it does over one whose files do not match.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rrtrain.core import files
from rrtrain.rundir import fields

NAME = "train_state.json"
#: train_state.json holds the resolved config and the loader's position: a few kB (16 MiB is far beyond it)
MAX_BYTES = files.LIMITS["train_state"]


#: how train_state.json spells a non-finite float (JSON has none; a best loss starts at infinity)
NONFINITE = "__nonfinite__"


def encode(obj: Any) -> Any:
    """`obj` with each non-finite float as {NONFINITE: "inf" | "-inf" | "nan"}: valid JSON that reads back exactly."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return {NONFINITE: repr(obj)}
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    return obj


def _decode(obj: dict) -> Any:
    if len(obj) == 1 and obj.get(NONFINITE) in ("inf", "-inf", "nan"):
        return float(obj[NONFINITE])
    return obj


class BadTrainState(ValueError):
    """train_state.json cannot be used; the message names the field."""


def read(path: Path) -> dict[str, Any]:
    """The checked contents of `path` (a train_state.json). OSError when it cannot be read, BadTrainState when
    it is not JSON or a field is wrong."""
    raw = files.read_bytes(path, MAX_BYTES)
    try:
        data = json.loads(raw, object_hook=_decode)
    except RecursionError:
        raise BadTrainState(f"{NAME}: nested too deeply") from None
    except ValueError as err:
        raise BadTrainState(f"{NAME}: not JSON ({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
    return check(data)


def _ints_in_range(value: Any, where: str, depth: int = 0) -> None:
    if depth > 64:
        raise BadTrainState(f"{NAME}: {where} is nested too deeply")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > fields.INT_MAX:
        raise BadTrainState(f"{NAME}: {where} is an integer beyond 64 bits")
    if isinstance(value, dict):
        for k, v in value.items():
            _ints_in_range(v, f"{where}.{k}" if where else str(k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _ints_in_range(v, f"{where}[{i}]", depth + 1)


def _need(ok: bool, key: str, value: Any, what: str) -> None:
    if not ok:
        raise BadTrainState(f"{NAME}: field {key!r} is not {what} (got {fields.short(value)})")


def check(data: Any) -> dict[str, Any]:
    """`data` when every field a resume takes is of its type and range; BadTrainState naming the first that is not."""
    if not isinstance(data, dict):
        raise BadTrainState(f"{NAME}: not a JSON object (a {type(data).__name__})")
    _ints_in_range(data, "")
    for key in ("step", "tokens", "skipped"):
        _need(fields.step(data.get(key)) is not None and data[key] >= 0, key, data.get(key), "a count")
        data[key] = int(data[key])
    wall = data.get("wall_s")
    _need(fields.finite(wall) is not None and wall >= 0, "wall_s", wall, "a number of seconds")
    best = data.get("best_val_loss")  # inf until the first evaluation
    _need(fields.number(best) is not None and not math.isnan(best), "best_val_loss", best, "a loss or Infinity")
    last = data.get("last_val_loss")
    _need(last is None or fields.number(last) is not None, "last_val_loss", last, "a number or null")
    world = data.get("world_size")
    _need(fields.step(world) is not None and world >= 1, "world_size", world, "a world size")
    for key in ("config", "loader"):
        _need(isinstance(data.get(key), dict), key, data.get(key), "an object")
    consumed = data["loader"].get("samples_consumed")
    _need(fields.step(consumed) is not None and consumed >= 0, "loader.samples_consumed", consumed, "a count")
    for key in ("callbacks", "files"):
        _need(data.get(key) is None or isinstance(data[key], dict), key, data.get(key), "an object")
    return data

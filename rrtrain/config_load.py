"""How plain data becomes a typed config: YAML files read as untrusted input (`base:` chains, bounded), `a.b=c`
overrides, and dataclasses built from mappings with one-line errors that name the key (an unknown key suggests
the closest valid one; a wrong type says what was expected and what was given). What the settings are is
`rrtrain.config`'s."""

from __future__ import annotations

import dataclasses
import hashlib
import difflib
import keyword
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from rrtrain.core.errors import UsageError
from rrtrain.core.files import LIMITS, load_yaml as load_untrusted_yaml, read_named as read_untrusted


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + (" or null" if type(None) in typing.get_args(tp) else "")
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and gently convert) `value` against the annotation `tp`; raise a one-line UsageError."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**63 - 1:
        # beyond any setting, and beyond what Python prints past 4,300 digits: refused before any message shows it
        raise UsageError(f"{key}: an integer of {len(str(abs(value))) if abs(value) < 10**4000 else 'thousands of'} "
                         "digits is not a setting")
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            if dataclasses.is_dataclass(arg) and isinstance(value, dict):  # its own errors name the key
                return build(arg, value, key)
            try:
                return _coerce(value, arg, key)
            except UsageError:
                pass
        raise UsageError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(f"{key}: expected {_type_name(tp)}, got {value!r}{hint}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise UsageError(f"{key}: expected a boolean (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise UsageError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                f = float(value.replace("_", ""))
            except ValueError:
                f = None
            if f is not None and f.is_integer():
                return int(f)
        raise UsageError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise UsageError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(number):  # every number of a config is meant finite: inf/nan would run as nonsense
            raise UsageError(f"{key}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise UsageError(f"{key}: expected a string, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin is list:  # a typed list: every item checked
        if not isinstance(value, list):
            raise UsageError(f"{key}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp in (list, dict):  # free-form fields (sweep files: lists of sbatch lines, maps of overrides)
        if isinstance(value, tp):
            return value
        raise UsageError(f"{key}: expected a {'list' if tp is list else 'mapping'}, got {value!r}")
    raise UsageError(f"{key}: unsupported type {tp!r}")


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys with a suggestion."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        where = prefix or "configuration"
        raise UsageError(f"{where}: expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        key = f"{key}_" if keyword.iskeyword(str(key)) else key  # `init.from` is the field `from_`
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"; did you mean '{(prefix + '.') if prefix else ''}{close[0]}'?" if close else ""
            valid = ", ".join(n[:-1] if keyword.iskeyword(n[:-1]) else n for n in names)
            raise UsageError(f"unknown key '{full}'{hint} (valid here: {valid})")
        kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path, _chain: tuple[Path, ...] = (), sha256: Optional[str] = None) -> dict:
    """Read a YAML mapping; `base: other.yaml` (relative to the file) is merged underneath. Every problem is a
    one-line UsageError naming the file: unreadable, not UTF-8, not YAML, not a mapping, a `base:` that is not a
    file name or that leads back to a file of its own chain. With `sha256`, the bytes parsed must have that
    digest, and the file must stand alone (no `base:`): a sweep's job reads the config it was submitted with."""
    path = Path(path)
    try:
        raw = read_untrusted(path, MAX_CONFIG_BYTES)
    except OSError as err:
        raise UsageError(f"cannot read config {path}: {err.strerror or type(err).__name__}") from None
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise UsageError(f"{path}: not the config this run was submitted with ({CONFIG_DIGEST_ENV}): it was changed "
                         "since; submit the sweep again")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        data = load_untrusted_yaml(text)  # aliases and nesting bounded: a few lines could otherwise hang the reader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply to be a config") from None
    except ValueError as err:  # a value YAML reads but Python cannot hold, e.g. an integer of 5,000 digits
        raise UsageError(f"{path}: not a config ({str(err).splitlines()[0][:120]})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is not None and sha256 is not None:
        raise UsageError(f"{path}: base: a submitted config stands alone (its digest covers this file only)")
    if base is not None:
        if not isinstance(base, str) or not base.strip() or "\0" in base:
            raise UsageError(f"{path}: base: expected a file name, got {type(base).__name__}")
        try:
            here = path.resolve()
            target = (path.parent / base).resolve()
        except (OSError, RuntimeError):  # a loop of symbolic links (RuntimeError on Python 3.11, OSError later)
            raise UsageError(f"{path}: base: {base!r} cannot be resolved (a loop of symbolic links?)") from None
        chain = _chain + (here,)
        if target in chain:
            loop = " -> ".join(p.name for p in chain[chain.index(target):]) + f" -> {target.name}"
            raise UsageError(f"{path}: base: {base!r} leads back to itself ({loop})")
        if len(chain) >= MAX_BASE_DEPTH:
            raise UsageError(f"{path}: base: more than {MAX_BASE_DEPTH} configs deep")
        data = _merge(read_yaml(path.parent / base, chain), data)
    return data


#: set by a sweep's job (launchers.sweep.seal, which names it too): the SHA-256 the run's config file must have
CONFIG_DIGEST_ENV = "RRTRAIN_CONFIG_SHA256"
#: a config file larger than this is not one (a mistaken path to a dataset or a device)
MAX_CONFIG_BYTES = LIMITS["config"]
#: `base:` chains longer than this are refused (a chain of distinct files that never ends would exhaust the stack)
MAX_BASE_DEPTH = 32


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (['a', 'b'], value parsed as YAML)."""
    if "=" not in text:
        raise UsageError(f"override '{text}' is not of the form key.sub=value")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in parts):
        raise UsageError(f"override '{text}' has an empty key")
    try:
        value = load_untrusted_yaml(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):  # ValueError: e.g. an integer of 5,000 digits
        value = raw
    return parts, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = dict(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
            node[part] = dict(child)
            node = node[part]
        node[parts[-1]] = value
    return data


def dotted_keys(data: dict, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as `{"a.b.c": value}`, the form overrides, grids and resume checks name keys in."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(dotted_keys(value, full + "."))
        else:
            out[full] = value
    return out

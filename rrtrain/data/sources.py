"""Where a run's data comes from: one prepared dataset (`data.path`) or a weighted mixture of several
(`data.sources: [{path, weight, name}]`).

A mixture is read through streaming's own weighting: each source is a `Stream(proportion=weight)` of one
`StreamingDataset`, and each epoch draws as many samples as the sources hold together, every source its share of
them (`StreamingDataset.resample_streams`: a source smaller than its share repeats, a larger one is subsampled,
afresh each epoch). The loader (rrtrain.data.loader) orders them as it orders one dataset. What is checked here:

- the config's list (`normalise`, from `DataConfig`): weights positive numbers, names unique and usable as
  metric names (`val/<name>`), no path twice, `data.path` and `data.sources` not both set;
- the sources themselves (`read_mixture`): each a prepared dataset, all with one tokenizer (the manifests'
  `tokenizer_hash`) and one seq_len.

Every problem is a one-line UsageError. Import-light (no torch, no streaming): the config uses it.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

from rrtrain.core.errors import UsageError
from rrtrain.data.manifest import is_remote, read_manifest

#: the keys of one entry of `data.sources`
SOURCE_KEYS = ("path", "weight", "name")
#: a source's name: a metric name (`val/<name>`), a cache directory's and a report column's
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Source:
    path: str
    weight: float
    name: str


@dataclass(frozen=True)
class Mixture:
    """The sources of a run with their manifests, and the manifest the run resolves against (`manifest`: the
    shared vocabulary and seq_len, a fingerprint of every source's fingerprint and weight, the weighted mean of
    their unigram entropies)."""

    sources: tuple[Source, ...]
    manifests: tuple[dict[str, Any], ...]
    manifest: dict[str, Any]


def default_name(path: str) -> str:
    """A source's name when none is given: its directory's name (the last part of a URL)."""
    return os.path.basename(path.rstrip("/")) or path


def _weight(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{key}.weight: expected a positive number (the source's share, relative to the "
                         f"others'), got {value!r}")
    weight = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
    if not math.isfinite(weight) or weight <= 0:
        raise UsageError(f"{key}.weight must be a positive finite number, got {value!r}"
                         + (" (leave the source out instead)" if weight == 0 else ""))
    return weight


def normalise(path: Optional[str], sources: Optional[list]) -> Optional[list[dict[str, Any]]]:
    """`data.sources` checked and written out in full (`{path, weight, name}`, the name defaulting to the
    directory's name), or None when unset; raises a one-line UsageError naming the entry."""
    if sources is None:
        return None
    if path is not None:
        raise UsageError("data.path and data.sources are both set: data.path names one dataset, data.sources a "
                         "mixture; set one of them")
    if not sources:
        raise UsageError("data.sources is empty: list at least one {path, weight} (or set data.path)")
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(sources):
        key = f"data.sources[{i}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{key}: expected a mapping {{path, weight, name}}, got {entry!r}")
        for k in entry:
            if k not in SOURCE_KEYS:
                close = difflib.get_close_matches(str(k), SOURCE_KEYS, n=1, cutoff=0.5)
                hint = f"; did you mean '{key}.{close[0]}'?" if close else ""
                raise UsageError(f"unknown key '{key}.{k}'{hint} (valid here: {', '.join(SOURCE_KEYS)})")
        where = entry.get("path")
        if not isinstance(where, str) or not where.strip() or "\0" in where:
            raise UsageError(f"{key}.path: expected a directory written by `rrtrain prep` (or a URL), got {where!r}")
        if "weight" not in entry:
            raise UsageError(f"{key}.weight is missing: give each source a positive weight (its share of the "
                             "samples, relative to the others')")
        weight = _weight(entry["weight"], key)
        name = entry.get("name")
        if name is None:
            name = default_name(where)
            if not NAME.fullmatch(name):
                raise UsageError(f"{key}: the directory's name {name!r} cannot name the source (letters, digits, "
                                 "'_', '.', '-'; at most 64): give it a name")
        elif not isinstance(name, str) or not NAME.fullmatch(name):
            raise UsageError(f"{key}.name: {name!r} is not a source name (letters, digits, '_', '.', '-'; "
                             "at most 64, not starting with '.' or '-')")
        out.append({"path": where, "weight": weight, "name": name})
    for field, same in (("name", lambda s: s["name"]), ("path", lambda s: absolute(s["path"]))):
        seen: dict[Any, int] = {}
        for i, s in enumerate(out):
            if same(s) in seen:
                raise UsageError(f"data.sources[{i}]: {field} {s[field]!r} is data.sources[{seen[same(s)]}]'s too; "
                                 f"each source needs its own {field}")
            seen[same(s)] = i
    return out


def absolute(path: str) -> str:
    """A local path made absolute (a URL as it is): what a run records, so that it is found from any folder."""
    return path if is_remote(path) else os.path.abspath(path)


def absolute_data(data: Any) -> Any:
    """A `DataConfig` with `data.path` and every source's path absolute."""
    sources = None if data.sources is None else [{**s, "path": absolute(s["path"])} for s in data.sources]
    return dataclasses.replace(data, path=None if data.path is None else absolute(data.path), sources=sources)


def absolute_in_saved(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's recorded config with its data paths made absolute as this process would make them: a run
    that recorded a relative `data.path` (before paths were recorded absolute) resumes from the same folder."""
    data = config.get("data")
    if not isinstance(data, dict):
        return config
    data = dict(data)
    if isinstance(data.get("path"), str) and "\0" not in data["path"]:
        data["path"] = absolute(data["path"])
    return {**config, "data": data}


def sources_of(data: Any) -> tuple[Source, ...]:
    """The sources of a mixture (`data.sources`, normalised); () for the one-dataset form."""
    return tuple(Source(s["path"], float(s["weight"]), s["name"]) for s in data.sources or ())


def tokenizer_path(data: Any) -> Optional[str]:
    """The dataset whose manifest names the run's tokenizer: `data.path`, or a mixture's first source (they share
    one)."""
    if data.path is not None:
        return data.path
    return data.sources[0]["path"] if data.sources else None


def _short_hash(m: dict[str, Any]) -> str:
    h = m.get("tokenizer_hash")
    return f"{m.get('tokenizer') or '?'} {str(h)[:12] if h else 'without a hash'}"


def read_mixture(data: Any) -> Mixture:
    """Every source's manifest read and checked against the first's: one tokenizer (`tokenizer_hash`, vocabulary,
    token dtype) and one seq_len. Reads manifests only (the shards are verified as one dataset's are)."""
    sources = sources_of(data)
    manifests = []
    for i, s in enumerate(sources):
        try:
            manifests.append(read_manifest(s.path))
        except UsageError as err:
            raise UsageError(f"data.sources[{i}] ({s.name}): {err}") from None
    first, m0 = sources[0], manifests[0]
    for s, m in zip(sources[1:], manifests[1:]):
        if (m.get("tokenizer_hash"), m["vocab_size"], m["dtype"]) != (m0.get("tokenizer_hash"), m0["vocab_size"],
                                                                      m0["dtype"]):
            raise UsageError(f"data.sources: '{first.name}' and '{s.name}' were prepared with different tokenizers "
                             f"({_short_hash(m0)}, {m0['vocab_size']} tokens vs {_short_hash(m)}, {m['vocab_size']} "
                             "tokens): a mixture's sources must share one")
        if m["seq_len"] != m0["seq_len"]:
            raise UsageError(f"data.sources: '{first.name}' and '{s.name}' were packed with different seq_len "
                             f"({m0['seq_len']} vs {m['seq_len']}): a mixture's sources must share one")
    return Mixture(sources, tuple(manifests), mixture_manifest(sources, manifests))


def mixture_fingerprint(sources: tuple[Source, ...], manifests: tuple[dict[str, Any], ...] | list) -> str:
    """sha256 over every source's dataset fingerprint and weight, in order: what a resumed mixture must match
    (the names only label the sources)."""
    parts = [[m["fingerprint"], s.weight] for s, m in zip(sources, manifests)]
    return hashlib.sha256(("mixture:" + json.dumps(parts)).encode()).hexdigest()


def mixture_manifest(sources: tuple[Source, ...], manifests: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(s.weight for s in sources)
    m0 = manifests[0]
    splits: dict[str, dict[str, int]] = {}
    for m in manifests:
        for split, counts in m["splits"].items():
            into = splits.setdefault(split, {})
            for k in ("samples", "tokens"):
                if k in counts:
                    into[k] = into.get(k, 0) + counts[k]
    return {
        **m0,
        "source": "mixture",
        "splits": splits,
        # the mixture's own entropy needs its token counts: the weighted mean is a lower bound of it (a stall is
        # then called no sooner than against the mixture's own)
        "unigram_entropy": sum(s.weight * m["unigram_entropy"] for s, m in zip(sources, manifests)) / total,
        "fingerprint": mixture_fingerprint(sources, manifests),
        "sources": [{"name": s.name, "path": s.path, "weight": s.weight, "fingerprint": m["fingerprint"]}
                    for s, m in zip(sources, manifests)],
    }

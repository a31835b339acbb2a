"""The one reader of a prepared dataset's `manifest.json` (written by `rrtrain prep`, data_prep/manifest.py).

It imports neither torch nor streaming (a remote manifest is downloaded through streaming, loaded only then):
the planners, the sweep's estimates and `rrtrain status` read a manifest without paying for the loader.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any, Optional

from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.core.lazy_import import streaming_module

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_REQUIRED = ("format_version", "vocab_size", "eos_id", "seq_len", "dtype", "splits", "fingerprint", "unigram_entropy")


def is_remote(path: str) -> bool:
    """True for URLs streaming downloads from (s3://, gs://, oci://, hf://, dbfs:/, ...)."""
    return "://" in path or path.startswith("dbfs:")


#: a manifest is a few kB; a larger file is not one
MAX_MANIFEST_BYTES = files.LIMITS["manifest"]
DTYPES = ("uint8", "uint16", "int32", "uint32", "int64")
INT_MAX = 2**63 - 1


def _text(path: str) -> str:
    if not is_remote(path):
        return files.read_bytes(os.path.join(path, MANIFEST), MAX_MANIFEST_BYTES).decode("utf-8")
    CloudDownloader = streaming_module("streaming.base.storage.download").CloudDownloader
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, MANIFEST)
        CloudDownloader.direct_download(path.rstrip("/") + "/" + MANIFEST, local)
        return files.read_bytes(local, MAX_MANIFEST_BYTES).decode("utf-8")


def read_manifest(path: str) -> dict[str, Any]:
    """Load and check `manifest.json` of a prepared dataset (a local directory or a remote URL); every problem
    is a one-line UsageError."""
    try:
        text = _text(path)
    except FileNotFoundError as err:
        raise UsageError(f"no {MANIFEST} in '{path}' (is it a directory written by 'rrtrain prep'?)") from err
    except Exception as err:
        raise UsageError(f"cannot read {MANIFEST} of '{path}': {str(err).splitlines()[0] if str(err) else type(err).__name__}") from err
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{MANIFEST} of '{path}' is not valid JSON ({err.msg})") from err
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise UsageError(f"{MANIFEST} of '{path}' is not a manifest ({str(err).splitlines()[0][:120]})") from None
    except RecursionError:
        raise UsageError(f"{MANIFEST} of '{path}' is nested too deeply to be a manifest") from None
    missing = [k for k in _REQUIRED if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise UsageError(f"{MANIFEST} of '{path}' lacks {', '.join(missing)}")
    if manifest["format_version"] != FORMAT_VERSION:
        raise UsageError(f"{MANIFEST} of '{path}' has format_version {_short(manifest['format_version'])}; "
                         f"this rrtrain reads {FORMAT_VERSION}")
    why = manifest_problem(manifest)
    if why is not None:
        raise UsageError(f"{MANIFEST} of '{path}': {why}")
    return manifest


def _int(v: Any, lo: int, hi: int = INT_MAX) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _short(v: Any) -> str:
    try:
        r = repr(v)
    except ValueError:  # an int of thousands of digits
        r = f"<{type(v).__name__}>"
    return r if len(r) <= 40 else r[:37] + "..."


def manifest_problem(m: dict[str, Any]) -> Optional[str]:
    """What makes a manifest's fields unusable (the loader, the planner and the trainer take them as they are),
    naming the field; None when every field the readers use has its type and range."""
    if not _int(m["vocab_size"], 1, 2**32):
        return f"field 'vocab_size' is not a vocabulary size (got {_short(m['vocab_size'])})"
    if not _int(m["eos_id"], 0, m["vocab_size"] - 1):
        return f"field 'eos_id' is not a token id below vocab_size (got {_short(m['eos_id'])})"
    if "bos_id" in m and (not _int(m["bos_id"], 0, m["vocab_size"] - 1) or m["bos_id"] == m["eos_id"]):
        return f"field 'bos_id' is not a token id below vocab_size other than eos_id (got {_short(m['bos_id'])})"
    if not _int(m["seq_len"], 1, 2**24):
        return f"field 'seq_len' is not a sequence length (got {_short(m['seq_len'])})"
    if m["dtype"] not in DTYPES:
        return f"field 'dtype' is not one of {', '.join(DTYPES)} (got {_short(m['dtype'])})"
    if not isinstance(m["fingerprint"], str) or not m["fingerprint"]:
        return f"field 'fingerprint' is not text (got {_short(m['fingerprint'])})"
    e = m["unigram_entropy"]
    if not (isinstance(e, (int, float)) and not isinstance(e, bool) and -1 < e < 1e6 and math.isfinite(e) and e >= 0):
        return f"field 'unigram_entropy' is not a finite entropy (got {_short(e)})"
    splits = m["splits"]
    if not isinstance(splits, dict):
        return f"field 'splits' is not an object (got {_short(splits)})"
    for name, split in splits.items():
        if not isinstance(split, dict):
            return f"field 'splits.{_short(name)}' is not an object"
        for key in ("samples", "tokens"):
            if key in split and not _int(split[key], 0):
                return f"field 'splits.{name}.{key}' is not a count (got {_short(split[key])})"
    for key in ("compression", "tokenizer_hash", "tokenizer_file", "tokenizer"):
        if m.get(key) is not None and not isinstance(m[key], str):
            return f"field '{key}' is not text (got {_short(m[key])})"
    return None


def prepared_manifest(path: Optional[str]) -> Optional[dict[str, Any]]:
    """The manifest where the dataset is prepared already, else None: no `data.path`, a sweep whose `prep` has not
    run yet, or a remote dataset (planning and estimates never touch the network; the trainer reads it).
    A manifest that is there but broken is refused as `read_manifest` refuses it."""
    if path is None or is_remote(path) or not os.path.isfile(os.path.join(path, MANIFEST)):
        return None
    return read_manifest(path)

"""The one reader of a prepared dataset's `manifest.json` (written by `rrtrain prep`, data_prep/manifest.py).

It imports neither torch nor streaming (a remote manifest is downloaded through streaming, loaded only then):
the planners, the sweep's estimates and `rrtrain status` read a manifest without paying for the loader.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional

from rrtrain.core.errors import UsageError
from rrtrain.core.lazy_import import streaming_module

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_REQUIRED = ("format_version", "vocab_size", "eos_id", "seq_len", "dtype", "splits", "fingerprint", "unigram_entropy")


def is_remote(path: str) -> bool:
    """True for URLs streaming downloads from (s3://, gs://, oci://, hf://, dbfs:/, ...)."""
    return "://" in path or path.startswith("dbfs:")


def _text(path: str) -> str:
    if not is_remote(path):
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            return f.read()
    CloudDownloader = streaming_module("streaming.base.storage.download").CloudDownloader
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, MANIFEST)
        CloudDownloader.direct_download(path.rstrip("/") + "/" + MANIFEST, local)
        with open(local, encoding="utf-8") as f:
            return f.read()


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
    missing = [k for k in _REQUIRED if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise UsageError(f"{MANIFEST} of '{path}' lacks {', '.join(missing)}")
    if manifest["format_version"] != FORMAT_VERSION:
        raise UsageError(f"{MANIFEST} of '{path}' has format_version {manifest['format_version']}; this rrtrain reads {FORMAT_VERSION}")
    return manifest


def prepared_manifest(path: Optional[str]) -> Optional[dict[str, Any]]:
    """The manifest where the dataset is prepared already, else None: no `data.path`, a sweep whose `prep` has not
    run yet, or a remote dataset (planning and estimates never touch the network; the trainer reads it).
    A manifest that is there but broken is refused as `read_manifest` refuses it."""
    if path is None or is_remote(path) or not os.path.isfile(os.path.join(path, MANIFEST)):
        return None
    return read_manifest(path)

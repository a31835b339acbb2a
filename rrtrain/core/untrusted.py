"""The readers of files someone else may have put there, under their older name: they live in
`rrtrain.core.files`, the one file-access layer (no link followed, regular files only, bounded reads). Kept so
that `from rrtrain.core import untrusted` still reads as what it is."""

from __future__ import annotations

from rrtrain.core.files import (LIMITS, MAX_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, LinkRefused, NotRegular, TooLarge,
                                load_yaml, open_lock_file, open_named, open_regular, read_bytes, read_named)

__all__ = ["LIMITS", "MAX_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "LinkRefused", "NotRegular", "TooLarge", "load_yaml",
           "open_lock_file", "open_named", "open_regular", "read_bytes", "read_named"]

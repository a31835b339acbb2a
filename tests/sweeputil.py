"""A sweep's `sweep.json` as another process (another version, a person, a co-tenant) may have left it: written
as raw JSON, not through `launchers.sweep.record`, which only writes what it can type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_record(sweep_dir: Path, data: dict[str, Any]) -> None:
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    (Path(sweep_dir) / "sweep.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

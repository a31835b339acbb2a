"""Every streaming dataset rrtrain opens, in the product and in its tests, goes through
`rrtrain.data.shm.open_streaming_dataset`: the user's machine lock, stale names cleaned, a prefix registered
safely. An open around it races every run on the machine for a shared-memory prefix (a red suite once: a test
that opened a split itself crashed with `FileExistsError: '/000015_locals'` against another test's run). A test
that plays another program on purpose says so on the line: `# not through rrtrain`."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OPENS = re.compile(r"\b(StreamingDataset|get_shm_prefix)\(")
THE_ONE_PLACE = REPO / "rrtrain" / "data" / "shm.py"


def test_streaming_datasets_are_opened_in_one_place():
    around = []
    for folder in ("rrtrain", "data_prep", "launchers", "tests", "tools"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == THE_ONE_PLACE:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if OPENS.search(line) and "# not through rrtrain" not in line:
                    around.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not around, "open it with rrtrain.data.shm.open_streaming_dataset:\n" + "\n".join(around)

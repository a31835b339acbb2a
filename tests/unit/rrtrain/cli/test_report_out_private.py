"""`rrtrain report` reads others' sweeps as data but writes only where no one else can: its default output,
SWEEP_DIR/report, inside a sweep someone else owns or can write is one line naming `--out`, and an `--out` others
can write is refused the same way; nothing is made there. Budget: well under 1 s (in process, refused before the
analysis)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rrtrain.cli.report import main
from rrtrain.core.errors import UsageError

ANOTHER_USER = 12345


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """mallory's sweep of one finished run."""
    run = tmp_path / "sweep" / "tiny" / "review-0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    (run / "final.json").write_text(json.dumps({"status": "completed", "step": 1, "final_val_loss": 3.0,
                                                "variant": "review", "size": "tiny", "seed": 0}))
    return tmp_path / "sweep"


def refused(argv: list[str], *words: str) -> str:
    with pytest.raises(UsageError) as got:
        main(argv)
    message = str(got.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def test_the_default_report_in_a_sweep_others_can_write_is_refused_naming_out(sweep: Path) -> None:
    os.chmod(sweep, 0o775)  # a group-writable shared sweep
    refused([str(sweep)], str(sweep / "report"), "--out", "can be written by its group")
    assert not (sweep / "report").exists()
    os.chmod(sweep, 0o755)
    os.chown(sweep, ANOTHER_USER, ANOTHER_USER)  # mallory's own sweep, not writable by others: still not alice's
    refused([str(sweep)], "--out", "belongs to another user")
    assert not (sweep / "report").exists()


def test_an_out_others_can_write_is_refused(sweep: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    refused([str(sweep), "--out", str(shared / "report")], "--out", str(shared), "others")
    assert os.listdir(shared) == []

"""`rrtrain eval RUN` reads a run someone else can write (or owns) but writes nothing into it: its result file,
RUN/eval/step_NNNNNNNN-KEY.json, is refused there in one line naming `--out` before any model is loaded, and
`--out DIR` puts it in a directory of the user's own. Budget: well under 1 s (in process, no model, no lm-eval
run)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from rrtrain.cli.eval import main
from rrtrain.core.errors import UsageError
from rrtrain.eval import results

pytest.importorskip("lm_eval")

ANOTHER_USER = 12345


def fake_run(root: Path) -> Path:
    """As much of a run directory as `rrtrain eval` looks at before it loads the model."""
    (root / "checkpoints" / "step_00000002").mkdir(parents=True)
    (root / "config.yaml").write_text("{}\n")
    (root / "metrics.jsonl").write_text("")
    return root


def refused(call, *words: str) -> None:  # noqa: ANN001 - a call that writes (or would write) a result
    with pytest.raises(UsageError) as got:
        call()
    message = str(got.value)
    assert "\n" not in message and "--out" in message and all(w in message for w in words), message


def test_a_run_others_can_write_gets_no_result_file(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    os.chmod(run, 0o775)  # mallory's run, group-writable
    refused(lambda: main([str(run), "--tasks", "tiny_mc"]), str(run / "eval"), "can be written by its group")
    refused(lambda: results.write(run, 2, "tiny_mc", {"step": 2}), "can be written by its group")
    os.chmod(run, 0o755)
    os.chown(run, ANOTHER_USER, ANOTHER_USER)  # mallory's, writable by her alone: not alice's to write either
    refused(lambda: results.write(run, 2, "tiny_mc", {"step": 2}), "belongs to another user")
    assert not (run / "eval").exists()


def test_out_writes_the_result_elsewhere_and_is_checked_too(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    os.chmod(run, 0o775)
    mine = tmp_path / "mine" / "evals"
    path = results.write(run, 2, "tiny_mc", {"step": 2}, out=mine)
    assert path == mine / "step_00000002-tiny_mc.json" and json.loads(path.read_text()) == {"step": 2}
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700 and not (run / "eval").exists()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    refused(lambda: main([str(run), "--tasks", "tiny_mc", "--out", str(shared)]), str(shared), "others")
    assert os.listdir(shared) == []

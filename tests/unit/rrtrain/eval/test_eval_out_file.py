"""`rrtrain eval --out DIR` with a file on DIR's way (`--out ~/w/afile/res`), or a file at DIR itself, is refused in
one line, "... is not a directory", before any task or model is loaded (it ran the whole evaluation and failed at
the end). Budget: well under 1 s (in process, refused before lm-eval's index is built)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rrtrain.core import files
from rrtrain.core.errors import UsageError

pytest.importorskip("lm_eval")

from rrtrain.cli.eval import main  # noqa: E402 - after the skip


def fake_run(root: Path) -> Path:
    """As much of a run directory as `rrtrain eval` looks at before it loads the tasks and the model."""
    (root / "checkpoints" / "step_00000002").mkdir(parents=True)
    (root / "config.yaml").write_text("{}\n")
    (root / "metrics.jsonl").write_text("")
    return root


@pytest.mark.parametrize("under", [True, False])
def test_out_with_a_file_in_the_way_is_refused_before_anything_loads(tmp_path: Path, under: bool) -> None:
    run = fake_run(tmp_path / "run")
    afile = tmp_path / "afile"
    afile.write_text("")
    os.chmod(afile, 0o600)
    out = afile / "res" if under else afile
    with pytest.raises(UsageError) as got:
        main([str(run), "--tasks", "no_such_task_anywhere", "--out", str(out)])  # an unknown task: refused later
    message = str(got.value)
    assert message == f"--out {str(out)!r}: '{afile}' {files.NOT_A_DIRECTORY}", message
    assert afile.read_text() == "" and not (run / "eval").exists()

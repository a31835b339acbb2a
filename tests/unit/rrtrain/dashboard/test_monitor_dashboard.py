"""The dashboard's logdir (rrtrain.dashboard.tensorboard.build_logdir) and its command's bad input; the browser test is
tests/e2e/test_dashboard.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from rrtrain.dashboard.tensorboard import build_logdir, layout


def make_run(path, size, variant, seed, diag=True):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"model": {"size": size, "variant": variant},
                                                      "train": {"seed": seed}}))
    lines = [{"step": s, "loss": 5.0 - 0.1 * s, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64 * s} for s in (1, 2, 3)]
    if diag:
        lines.append({"kind": "diag", "step": 3, "block_grad_norm": [1.0], "gate_mean": [0.5, 0.6],
                      "gate_hist": [[0, 3, 1, 0], [0, 0, 4, 0]]})
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (path / "tb").mkdir()
    (path / "tb" / "events.out.tfevents.1.host").write_bytes(b"")


def test_the_logdir_names_runs_and_is_swapped_in_whole(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep / "tiny-review-s0", "tiny", "review", 0)
    make_run(sweep / "nested" / "rr-60m-standard-s1", "rr-60m", "standard", 1, diag=False)
    logdir, names = build_logdir(sweep)
    assert sorted(names) == ["rr-60m/standard/seed1", "tiny/review/seed0"]
    first = logdir.resolve()
    link = logdir / "tiny" / "review" / "seed0" / "events.out.tfevents.1.host"
    assert link.is_symlink() and link.resolve() == (sweep / "tiny-review-s0" / "tb" / "events.out.tfevents.1.host")
    assert len(list((logdir / "tiny" / "review" / "seed0").glob("*.rrtrain-dashboard"))) == 1
    logdir2, _ = build_logdir(sweep)
    assert logdir2 == logdir and logdir.resolve() != first and not first.exists()  # the old build is gone
    assert sorted(p.name for p in (sweep / ".dashboard").iterdir()) == \
        sorted([".rrtrain-key", "logdir", logdir.resolve().name])


def test_a_later_start_deletes_the_build_an_earlier_one_made(tmp_path, monkeypatch):
    """Each start is a process with a key of its own: the dashboard's directory key proves the old build."""
    from rrtrain.core import files

    sweep = tmp_path / "sweep"
    make_run(sweep / "tiny-review-s0", "tiny", "review", 0)
    first = build_logdir(sweep)[0].resolve()
    monkeypatch.setattr(files, "_PROCESS_KEY", os.urandom(32))
    second = build_logdir(sweep)[0].resolve()
    assert second != first and not first.exists()


def test_one_chart_per_quantity_and_size_matching_only_that_size():
    got = layout(["rr-60m", "tiny"])
    assert list(got) == ["size rr-60m", "size tiny"]
    assert got["size tiny"]["train loss"] == ["Multiline", ["^tiny/train_loss$", "^tiny/flags$"]]  # flags' markers
    assert got["size rr-60m"]["gate mean per block"] == ["Multiline", [r"^rr\-60m/gate_mean/\d+$"]]


def test_bad_input_is_one_line_and_status_2(tmp_path):
    for args in ([str(tmp_path / "missing")], [str(tmp_path)], [str(tmp_path), "--port", "0"],
                 [str(tmp_path), "--refresh", "0"], [str(tmp_path), "--refresh", "nan"]):
        proc = subprocess.run([sys.executable, "-m", "rrtrain", "dashboard", *args], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr

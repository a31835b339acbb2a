"""The run directory's readers on hostile content: files of the wrong shape, fields of the wrong type, garbage
and torn lines. Each is skipped or refused with one line naming the file (and the field), never a traceback,
and every consumer (report, status, sweep flags, cancel) copes with what the readers give it."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from launchers.sweep import record
from launchers.state import runstate
from launchers.state import status as status_cli
from launchers.state.flags import judge_sweep
from rrtrain.report.collect import find_runs, read_metrics
from rrtrain.rundir import layout, outcome, readers
from rrtrain.rundir import lock as runlock
from rrtrain.rundir.readers import Cancelled
from sweeputil import write_record
from trainutil import PY, REPO, env

GOOD = {"status": "completed", "step": 10, "tokens": 640, "final_val_loss": 2.0, "best_val_loss": 2.0,
        "params": 1e6, "variant": "review", "size": "tiny", "seed": 0, "wall_s": 1.0, "flags": []}


def run_dir(root: Path, name: str, final: object = None, metrics: str | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if final is not None:
        (d / layout.FINAL).write_text(final if isinstance(final, str) else json.dumps(final))
    if metrics is not None:
        (d / layout.METRICS).write_text(metrics)
    return d


def test_a_final_json_that_is_a_list_or_truncated_is_refused_in_one_line(tmp_path):
    for name, body, why in (("list", [GOOD], "not a JSON object (a list)"), ("string", '"completed"', "(a str)"),
                            ("torn", json.dumps(GOOD)[:30], "truncated or not JSON")):
        problems: list[str] = []
        assert readers.read_final(run_dir(tmp_path, name, body), problems) is None
        assert len(problems) == 1 and problems[0].startswith("final.json unreadable") and why in problems[0]
    assert readers.read_final(tmp_path / "list") is None  # no list to append to: still no traceback
    assert readers.read_final(tmp_path / "missing") is None


def test_fields_of_the_wrong_type_cost_only_that_field(tmp_path):
    bad = {**GOOD, "step": 3.5, "tokens": True, "flags": "stalled", "flag_details": ["x"], "final_val_loss": "2.0",
           "variant": ["review"], "seed": {"n": 1}}
    final = readers.read_final(run_dir(tmp_path, "r", bad))
    assert final is not None and final.status == "completed" and final.size == "tiny" and final.params == 1e6
    assert (final.step, final.tokens, final.flags, final.flag_details) == (None, None, (), {})
    assert (final.final_val_loss, final.variant, final.seed) == (None, None, None)
    named = " | ".join(final.problems)
    for field in ("'step'", "'tokens'", "'flags'", "'flag_details'", "'final_val_loss'", "'variant'"):
        assert field in named, named
    assert all(p.startswith("final.json: field") for p in final.problems)
    assert readers.parse_final({**GOOD, "step": 7.0}).step == 7  # an integral float is still a step
    assert readers.parse_final({**GOOD, "final_val_loss": float("nan")}).final_val_loss is None


def test_metrics_lines_that_are_not_records_are_skipped(tmp_path):
    lines = ['{"step": 1, "loss": 3.0, "tokens": 64}', '"loss"', '["loss", 1]', '{"step": 2.5, "loss": 2.9}',
             '{"step": true, "loss": 2.8}', '{"step": "3", "loss": 2.7}', '{"step": 4, "loss": 2.6, "tokens": 256}',
             '{"step": 4, "val_loss": 2.65}', '{"step": 5, "lo']
    path = run_dir(tmp_path, "r", metrics="\n".join(lines)) / layout.METRICS
    tail = readers.read_tail(path, None, only=None)
    assert all(isinstance(r, dict) for r in tail) and len(tail) == 6  # the string, the list, the torn line: gone
    latest = readers.latest_records(path)
    assert latest.train is not None and latest.train["step"] == 4 and latest.val["step"] == 4
    assert latest.speed is None
    assert [r is None for r in readers.records(path)] == [False, True, True, False, False, False, False, False, True]
    m = read_metrics(path)  # the report: "3" is a step written as text; 2.5 and true are not
    assert m.train_steps.tolist() == [1, 3, 4] and m.bad_lines == 5


def test_latest_records_skip_a_float_step_at_the_end(tmp_path):
    path = run_dir(tmp_path, "r", metrics='{"step": 9, "loss": 1.0}\n{"step": 9.5, "loss": 0.5}\n') / layout.METRICS
    assert readers.latest_records(path).train == {"step": 9, "loss": 1.0}


def test_config_and_marker_and_lock_of_the_wrong_shape(tmp_path):
    d = run_dir(tmp_path, "r")
    (d / layout.CONFIG).write_text("- a\n- b\n")
    problems: list[str] = []
    assert readers.read_config(d, problems) == {} and problems == ["config.yaml unreadable: not a mapping (a list)"]
    (d / layout.CONFIG).write_text("model: [unclosed\n")
    problems = []
    assert readers.read_config(d, problems) == {} and problems[0].startswith("config.yaml unreadable")
    (d / layout.CANCELLED).write_text("[1, 2]")
    marker = readers.read_cancelled(d)
    assert marker is not None and "cancelled.json unreadable" in marker.reason  # it exists: the run is cancelled
    (d / layout.CANCELLED).write_text(json.dumps({"reason": "stalled: plateau", "flags": "stalled"}))
    assert readers.read_cancelled(d) == Cancelled(reason="stalled: plateau", flags=(), time=None)
    (d / layout.LOCK).write_text("[1]")
    assert runlock.read(d) is None
    (d / layout.LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": "not a pid"}))
    assert runlock.holder_alive(runlock.read(d)) is False


def test_the_ending_is_decided_in_one_place():
    stalled = Cancelled(reason="stalled: plateau at step 9", flags=("stalled",))
    diverged = Cancelled(reason="diverged: loss 1e9", flags=("diverged", "early_stall"))
    end = outcome.decide("preempted", "stopped by SIGTERM at step 12", stalled)
    assert (end.status, end.exit_code, end.cancelled) == ("stalled", 4, stalled)
    assert end.reason == "cancelled as flagged (stalled: plateau at step 9); stopped by SIGTERM at step 12"
    assert outcome.decide("failed", "", diverged).status == "diverged"
    for status in outcome.ENDED_FOR_GOOD:  # what a run reached by itself stands
        assert outcome.decide(status, "why", stalled) == outcome.Outcome(status, "why")
    assert outcome.decide("preempted", "why", None) == outcome.Outcome("preempted", "why")
    assert outcome.Outcome("preempted", "").exit_code == 75


def test_every_consumer_survives_a_hostile_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    dirs = {
        "list": run_dir(sweep, "list", [GOOD], metrics='{"step": 1, "loss": 3.0}\n'),
        "torn": run_dir(sweep, "torn", json.dumps(GOOD)[:25], metrics='"x"\n[1]\n{"step": 1, "lo'),
        "types": run_dir(sweep, "types", {**GOOD, "status": "preempted", "step": "ten", "flags": {"a": 1}},
                         metrics='{"step": 1.5, "loss": 3.0}\n{"step": 2, "loss": "nan?"}\n'),
        "marker": run_dir(sweep, "marker", metrics='{"step": 3, "loss": 3.0, "tokens": "x"}\n'),
    }
    (dirs["marker"] / layout.CANCELLED).write_text("{torn")
    (dirs["list"] / layout.CONFIG).write_text(": : :\n")  # nothing to fall back on for the identity either
    runs = {rid: {"size": "tiny", "variant": "review", "seed": 0, "dir": str(d), "resources": {},
                  "config": {"train": {"max_steps": 10, "global_batch": 8}, "model": {"size": "tiny"},
                             "data": {"path": None}}} for rid, d in dirs.items()}
    write_record(sweep, {"version": 1, "name": "hostile", "runs": runs, "submissions": []})

    rows = {r["id"]: r for r in status_cli.collect(sweep)["runs"]}
    assert rows["list"]["state"] == "failed" and rows["torn"]["state"] == "failed"  # ran, left no usable final
    assert rows["types"]["state"] == "preempted" and rows["types"]["flags"] == []
    assert rows["marker"]["state"] == "stalled" and "cancelled" in rows["marker"]["flags"]
    assert rows["marker"]["step"] == 3 and rows["marker"]["tokens"] is None
    assert runstate.classify(None, None, None, True, True, readers.read_cancelled(dirs["marker"])) == "stalled"

    report = {r.rel: r for r in find_runs(sweep)}
    assert report["list"].category == "unusable" and "not a JSON object" in report["list"].reason
    assert any(p.startswith("config.yaml unreadable") for p in report["list"].problems)
    assert report["torn"].category == "unusable" and report["torn"].metrics.bad_lines == 3
    assert report["types"].category == "unfinished" and any("'step'" in p for p in report["types"].problems)

    verdicts = {v.rel: v for v in judge_sweep(sweep)}
    assert verdicts["types"].status == "preempted" and verdicts["types"].records == []
    assert verdicts["marker"].step == 3 and verdicts["marker"].tokens is None

    proc = subprocess.run([PY, "-m", "rrtrain", "status", str(sweep), "--json"], capture_output=True, text=True,
                          env=env(), cwd=REPO, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["counts"] == {"failed": 2, "preempted": 1, "stalled": 1}


@pytest.mark.parametrize("name", ["checkpoints", "tb", "data_cache"])
def test_runs_are_not_searched_for_inside_a_run(tmp_path, name):
    d = run_dir(tmp_path, "r", GOOD)
    run_dir(d, name, GOOD)
    assert layout.run_dirs(tmp_path) == [d]

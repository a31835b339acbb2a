"""Successive halving on the local executor with real tiny runs: a three-point learning-rate grid of one
(size, variant), one point hopeless. Pruning stops exactly the points the rule names at each rung (worked out
here again from the runs' own metrics), the pruned runs never trained past their rung, status and the summary
say what pruning saved, the report leaves them out; raising `keep` resumes the pruned runs the new `keep` admits
(the point pruned at rung 2), and only those, and a run paused and pruned then resumed trains exactly as the same
run never interrupted. Seven training processes in all (the local executor's fresh interpreters: three to rung 1,
two to rung 2, one to the end, one resumed): about 55 s of CPU."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from trainutil import PY, REPO, env, final, losses, records, run_cmd

pytestmark = pytest.mark.slow

STEPS = 20
RUNGS = (5, 10)  # 0.25 and 0.5 of 20 steps, multiples of train.stop_check_every=5
LRS = {"tiny-standard-s0": 1e-6, "tiny-standard-s1": 3e-3, "tiny-standard-s2": 1e-2}  # s0 is hopeless


@pytest.fixture(autouse=True)
def as_a_shell_would(monkeypatch):
    """`rrtrain` runs in this process (its runs are still processes of their own, started by the local executor)
    from the repository, with the environment trainutil.env() gives a subprocess: the runs inherit it."""
    monkeypatch.chdir(REPO)
    for key, value in env().items():
        monkeypatch.setenv(key, value)


def rrtrain(*args) -> subprocess.CompletedProcess:
    """`rrtrain ARGS` as the command line runs it (rrtrain.cli.main), in this process: its exit status and what it
    printed."""
    from rrtrain.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return subprocess.CompletedProcess(["rrtrain", *map(str, args)], code, out.getvalue(), err.getvalue())


def val_at(run_dir: Path, step: int) -> float:
    return [r["val_loss"] for r in records(run_dir) if r.get("step") == step and "val_loss" in r][-1]


def test_pruning_stops_the_worst_points_rung_by_rung_and_a_raised_keep_resumes_them_exactly(tmp_path,
                                                                                             stories_data):
    spec = tmp_path / "grid.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "grid", "config": "tiny.yaml", "data": str(stories_data), "variants": ["standard"],
        "sizes": {"tiny": {"seeds": 3, "overrides": {"train.max_steps": STEPS}}},
        "overrides": {"train.global_batch": 8, "train.micro_batch": 8, "train.log_every": 5, "train.eval_every": 5,
                      "train.stop_check_every": 5, "train.warmup_steps": 2, "data.eval_batches": 1,
                      "model.n_layers": 2},
        # three points of one (size, variant), written out run by run (one seed each)
        "runs": {rid: {"train.lr": lr} for rid, lr in LRS.items()},
        "prune": {"rungs": [0.25, 0.5], "keep": 0.5},
        "resources": {"time_min": 10, "signal_delay_s": 30}}, sort_keys=False))
    out = tmp_path / "sweep"
    dry = rrtrain("sweep", spec, "--out", out, "--dry-run")
    assert dry.returncode == 0 and "prune: rungs at steps 5, 10 of 20 for 3 run(s)" in dry.stdout, dry.stdout

    proc = rrtrain("sweep", spec, "--out", out, "--executor", "local", "--parallel", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the rule again, from the runs' own metrics: rung 1 keeps ceil(0.5 x 3) = 2, rung 2 keeps 1
    at1 = {rid: val_at(out / rid, RUNGS[0]) for rid in LRS}
    first = max(at1, key=at1.get)
    assert first == "tiny-standard-s0"  # the hopeless learning rate
    rest = [rid for rid in LRS if rid != first]
    at2 = {rid: val_at(out / rid, RUNGS[1]) for rid in rest}
    second, best = max(at2, key=at2.get), min(at2, key=at2.get)
    ended = {rid: final(out / rid) for rid in LRS}
    assert (ended[first]["status"], ended[first]["step"], ended[first]["pruned"]["rung"]) == ("pruned", 5, 1)
    assert (ended[second]["status"], ended[second]["step"], ended[second]["pruned"]["rung"]) == ("pruned", 10, 2)
    assert (ended[best]["status"], ended[best]["step"]) == ("completed", STEPS)
    assert max(losses(out / first)) == 5 and max(losses(out / second)) == 10  # never trained past the rung
    assert ended[second]["pruned"]["value"] == pytest.approx(at2[second])
    assert f"{first}: pruned at rung 1 of 2 (step 5)" in proc.stdout
    assert "pruning: 2 run(s) pruned, saving 42% of the training FLOPs" in proc.stdout  # (15 + 10) / 60 steps

    st = rrtrain("status", out)
    assert st.returncode == 0 and "pruned: 2" in st.stdout and "pruning: 2 run(s) pruned" in st.stdout, st.stdout
    from rrtrain.report.collect import find_runs

    cats = {r.rel: r.category for r in find_runs(out)}
    assert (cats[first], cats[second], cats[best]) == ("unfinished", "unfinished", "ok")

    again = rrtrain("sweep", spec, "--out", out, "--executor", "local")  # the same rule decides the same
    assert again.returncode == 0 and "to go on" not in again.stdout, again.stdout

    # a larger budget of kept points: rung 1 still keeps ceil(0.6 x 3) = 2, rung 2 now keeps ceil(0.6 x 2) = 2; the
    # run pruned at rung 2 resumes where it stopped and trains to its end, the one pruned at rung 1 stays as it was
    raised = rrtrain("sweep", spec, "--out", out, "--executor", "local", "--parallel", "2", "prune.keep=0.6")
    assert raised.returncode == 0, raised.stdout + raised.stderr
    assert [line.split()[2] for line in raised.stdout.splitlines() if line.startswith("[local] started")] == [second]
    assert {rid: final(out / rid)["status"] for rid in LRS} == {first: "pruned", second: "completed",
                                                               best: "completed"}
    assert final(out / first) == ended[first] and max(losses(out / first)) == 5
    assert not (out / second / "pause.json").exists()
    ref = tmp_path / "uninterrupted"
    train = run_cmd([PY, "-m", "rrtrain.train", str(out / "configs" / f"{second}.yaml"), f"run.dir={ref}"], env(),
                    timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    assert losses(out / second) == losses(ref) and len(losses(ref)) == STEPS  # paused twice, pruned, resumed
    vals = [{r["step"]: r["val_loss"] for r in records(d) if "val_loss" in r} for d in (out / second, ref)]
    assert vals[0] == vals[1]
    assert json.loads((out / "prune.json").read_text())["saved"]["pruned_runs"] == 1

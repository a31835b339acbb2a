"""A tiny sweep end to end through the `local` and `debug` executors, with real training runs: completion and
status, a failing run, idempotent resubmission, refusal of a changed sweep, and one writer per run dir.
Budget: about 2 minutes on 2 quiet cores."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from trainutil import PY, REPO, env, final, losses, run_cmd, spawn

pytestmark = pytest.mark.slow


def sweep_file(tmp_path: Path, data: Path, name: str, **changes) -> Path:
    body = {"name": name, "config": "tiny.yaml", "data": str(data), "variants": ["review", "standard"],
            "match": "review", "sizes": {"tiny": {"seeds": 1, "overrides": {"train.max_steps": 6}}},
            "overrides": {"train.global_batch": 8, "train.micro_batch": 8, "train.log_every": 2,
                          "train.eval_every": 3, "data.eval_batches": 1, "model.n_layers": 2},
            "resources": {"time_min": 10, "signal_delay_s": 30}, **changes}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(body, sort_keys=False))
    return p


def rrtrain(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`rrtrain ARGS` in a process of its own (the debug executor trains inside it), forked by the tests' fork
    server (trainutil.spawn)."""
    return run_cmd([PY, "-m", "rrtrain", *map(str, args)], env(), timeout, module="rrtrain")


@pytest.fixture
def in_process(monkeypatch):
    """`rrtrain ARGS` as the command line runs it (rrtrain.cli.main), in this process: its exit status and what it
    printed. From the repository, with the environment trainutil.env() gives a subprocess, which the local
    executor's runs (processes of their own) inherit."""
    from rrtrain.cli.main import main

    monkeypatch.chdir(REPO)
    for key, value in env().items():
        monkeypatch.setenv(key, value)

    def rrtrain(*args: str) -> subprocess.CompletedProcess:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
        return subprocess.CompletedProcess(["rrtrain", *map(str, args)], code, out.getvalue(), err.getvalue())

    return rrtrain


def status(rrtrain, out: Path) -> dict:
    proc = rrtrain("status", out, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_local_sweep_failure_resubmission_and_refusal(tmp_path, stories_data, in_process):
    rrtrain, out = in_process, tmp_path / "sweep"
    fail = {"tiny-standard-s0": {"data.path": str(tmp_path / "no-such-data")}}
    spec = sweep_file(tmp_path, stories_data, "loc", runs=fail)
    proc = rrtrain("sweep", spec, "--out", out, "--executor", "local", "--parallel", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one run did not complete
    st = status(rrtrain, out)
    rows = {r["id"]: r for r in st["runs"]}
    assert st["counts"] == {"failed": 1, "completed": 1}
    assert st["runs"][0]["id"] == "tiny-standard-s0"  # the run needing attention comes first
    ok = rows["tiny-review-s0"]
    assert (ok["state"], ok["step"], ok["total_steps"]) == ("completed", 6, 6)
    assert ok["loss"] is not None and ok["val_loss"] is not None and ok["tokens"] == 6 * 8 * 64
    assert sorted(losses(out / "tiny-review-s0")) == [1, 2, 3, 4, 5, 6]
    assert rows["tiny-standard-s0"]["state"] == "failed"
    assert (out / "slurm" / "logs" / "tiny-review-s0.log").stat().st_size > 0
    assert (out / "code" / "rrtrain" / "training" / "trainer.py").exists()
    rec = json.loads((out / "sweep.json").read_text())
    assert rec["code"]["path"] == str(out / "code") and len(rec["sweep_sha256"]) == 64

    # again: only the failed run is submitted (and fails again); the completed one is left alone
    before = (out / "tiny-review-s0" / "final.json").stat().st_mtime_ns
    proc = rrtrain("sweep", spec, "--out", out, "--executor", "local")
    assert proc.returncode == 1
    assert "tiny-review-s0: completed, leaving it alone" in proc.stdout
    rec = json.loads((out / "sweep.json").read_text())
    assert list(rec["submissions"][-1]["jobs"]) == ["tiny-standard-s0"]
    assert (out / "tiny-review-s0" / "final.json").stat().st_mtime_ns == before

    # a changed sweep file that alters existing runs is refused with the differences; nothing is written
    changed = sweep_file(tmp_path, stories_data, "loc", runs=fail,
                         sizes={"tiny": {"seeds": 1, "overrides": {"train.max_steps": 7}}})
    proc = rrtrain("sweep", changed, "--out", out, "--executor", "local")
    assert proc.returncode == 2
    assert "tiny-review-s0: train.max_steps: 6 -> 7" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert json.loads((out / "sweep.json").read_text()) == rec


def test_debug_sweep_then_nothing_to_resubmit_and_a_warm_started_run_trains_alike(tmp_path, stories_data, in_process):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path, stories_data, "dbg", variants=["review"])
    proc = rrtrain("sweep", spec, "--out", out, "--executor", "debug")  # it trains: a process of its own
    assert proc.returncode == 0, proc.stdout + proc.stderr
    st = status(in_process, out)
    assert st["counts"] == {"completed": 1} and st["runs"][0]["step"] == 6
    assert not list(out.glob("slurm/*.sbatch"))  # rendered by --dry-run only: no executor reads them
    proc = in_process("sweep", spec, "--out", out, "--executor", "debug")
    assert proc.returncode == 0 and "nothing to submit" in proc.stdout
    assert len(json.loads((out / "sweep.json").read_text())["submissions"]) == 1

    # the same run forked by the local executor's warm interpreter (launchers.executors.warm): the same losses,
    # bit for bit, as the run trained in a process started for it
    warm = tmp_path / "warm"
    proc = in_process("sweep", spec, "--out", warm, "--executor", "local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "forked by the warm interpreter" in proc.stdout
    assert losses(warm / "tiny-review-s0") == losses(out / "tiny-review-s0")
    assert final(warm / "tiny-review-s0")["final_val_loss"] == final(out / "tiny-review-s0")["final_val_loss"]


def test_two_copies_of_one_run_one_writer(tmp_path, stories_data):
    run_dir = tmp_path / "run"
    cmd = [PY, "-m", "rrtrain.train", str(REPO / "configs" / "train" / "tiny.yaml"), f"data.path={stories_data}",
           f"run.dir={run_dir}", "train.max_steps=120", "train.eval_every=0", "train.ckpt_every=0",
           "model.n_layers=2", "train.global_batch=8", "train.micro_batch=8", "run.lock_wait_s=1"]
    procs = [spawn(cmd, env(), merge_stderr=True) for _ in range(2)]
    deadline = time.time() + 300
    while all(p.poll() is None for p in procs) and time.time() < deadline:
        time.sleep(0.05)
    loser = next(p for p in procs if p.poll() is not None)
    winner = next(p for p in procs if p is not loser)
    alive_at_loss = winner.poll() is None
    final_at_loss = (run_dir / "final.json").exists()
    out_loser = loser.stdout.read()
    assert winner.wait(timeout=300) == 0, winner.stdout.read()
    assert loser.returncode == 73, out_loser
    assert "is locked by host" in out_loser and "waited 1 s (run.lock_wait_s)" in out_loser
    assert alive_at_loss and not final_at_loss  # the second copy wrote nothing, not even final.json
    assert final(run_dir)["status"] == "completed" and final(run_dir)["step"] == 120
    assert sorted(losses(run_dir)) == list(range(1, 121))
    assert not (run_dir / "run.lock").exists()


def test_array_script_forwards_the_signal_requeues_and_resumes(tmp_path, stories_data, in_process):
    """The rendered array.sbatch outside Slurm (a stand-in `scontrol` records the requeue): USR2 to the batch
    shell reaches the run as TERM, the run checkpoints and exits 75, the shell requeues its array task; the
    restarted task resumes and completes with every step exactly once."""
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path, stories_data, "arr", variants=["review"],
                      sizes={"tiny": {"seeds": 1, "overrides": {"train.max_steps": 60}}})
    proc = in_process("sweep", spec, "--out", out, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "scontrol").write_text('#!/bin/bash\necho "$@" >> "$FAKE_SCONTROL_LOG"\n')
    (fakebin / "scontrol").chmod(0o755)
    task_env = {**env(), "PATH": f"{fakebin}:{env()['PATH']}", "FAKE_SCONTROL_LOG": str(tmp_path / "scontrol.log"),
                "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0"}
    script = out / "slurm" / "array-tiny.sbatch"
    run_dir = out / "tiny-review-s0"
    with open(tmp_path / "task.log", "w") as log:
        task = subprocess.Popen(["bash", str(script)], env=task_env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while not losses(run_dir) or max(losses(run_dir)) < 5:
            assert task.poll() is None and time.time() < deadline, (tmp_path / "task.log").read_text()[-3000:]
            time.sleep(0.05)
        task.send_signal(signal.SIGUSR2)
        assert task.wait(timeout=300) == 0
    text = (tmp_path / "task.log").read_text()
    assert "checkpointed (exit 75); requeueing 77_0" in text, text[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 77_0\n"
    stopped = final(run_dir)
    assert stopped["status"] == "preempted" and 5 <= stopped["step"] < 60
    restart = subprocess.run(["bash", str(script)], env={**task_env, "SLURM_RESTART_COUNT": "1"},
                             capture_output=True, text=True, timeout=300)
    assert restart.returncode == 0, restart.stdout[-3000:]
    assert final(run_dir)["status"] == "completed" and final(run_dir)["step"] == 60
    assert sorted(losses(run_dir)) == list(range(1, 61))
    assert (tmp_path / "scontrol.log").read_text() == "requeue 77_0\n"  # completed: no second requeue

"""`log.wandb` in real training runs, W&B offline, each run read back with W&B's own reader
(`wandb leet inspect --json`, the records of a run's `.wandb` transaction log).

One run directory started twice: a fresh run to step 8 whose monitor flags `stalled`, then the same directory
resumed past step 8, cancelled as flagged (cancelled.json, then SIGTERM, as `rrtrain sweep --cancel-flagged`
does). And a run without `log.wandb`, which must not import wandb."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from trainutil import (PY, REPO, TINY, env, final, kill_group, records, run_cmd, spawn, train, train_cmd,
                       wait_for_step)

pytest.importorskip("wandb")

from rrtrain.monitoring.wandb_logger import wandb_run_id  # noqa: E402
from rrtrain.rundir.writers import write_cancelled  # noqa: E402

FAST = ["train.global_batch=4", "train.micro_batch=4", "train.log_every=2", "train.eval_every=4",
        "train.warmup_steps=2", "train.stop_check_every=2", "data.eval_batches=1",
        # a stall the monitor must call within 8 steps: any smoothed loss above the unigram entropy has stalled
        "monitor.min_steps=4", "monitor.window=4", "monitor.min_improvement=5",
        "log.wandb.mode=offline", "log.wandb.project=rrtrain-test", "log.wandb.group=grp"]


def inspect(run_file: Path) -> list[dict]:
    """Every record of one `.wandb` file, as W&B's own reader gives them."""
    proc = subprocess.run([PY, "-m", "wandb", "leet", "inspect", "--json", str(run_file)], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def of_type(recs: list[dict], kind: str) -> list[dict]:
    return [r[kind] for r in recs if r["type"] == kind]


def history(recs: list[dict], key: str) -> dict[int, float]:
    return {int(h["step"]["num"]): h["item"][key] for h in of_type(recs, "history") if key in h["item"]}


def summary(recs: list[dict]) -> dict:
    out: dict = {}
    for s in of_type(recs, "summary"):
        out.update(s["update"])
    return out


@pytest.fixture(scope="module")
def two_starts(tmp_path_factory, stories_data):
    """(run dir, W&B dir, [records of the first start's .wandb, of the second's], second start's exit)."""
    root = tmp_path_factory.mktemp("wandb")
    run, wdir = root / "run", root / "wandb-files"
    wdir.mkdir()
    e = {**env(), "WANDB_DIR": str(wdir)}
    proc = run_cmd([PY, "-m", "rrtrain.train", TINY, f"data.path={stories_data}", f"run.dir={run}",
                    "train.max_steps=8", *FAST], e, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    first = set((wdir / "wandb").glob("offline-run-*"))
    write_cancelled(run, "stalled (test)", ["stalled"])  # what `rrtrain sweep --cancel-flagged` writes first
    second = spawn(train_cmd(run, stories_data, ["train.max_steps=400", "train.allow_config_change=true", *FAST]), e,
                   merge_stderr=True)
    try:
        wait_for_step(run, 12, second)
        kill_group(second, signal.SIGTERM)
        code = second.wait(timeout=120)
    finally:
        kill_group(second)
    later = set((wdir / "wandb").glob("offline-run-*")) - first
    assert len(first) == 1 and len(later) == 1, (first, later)
    files = [next(d.glob("*.wandb")) for d in (*first, *later)]
    return run, wdir, [inspect(f) for f in files], code


def test_the_first_start_in_wandb_series_config_flags_summary(two_starts):
    run, wdir, (recs, _), _ = two_starts
    (meta,) = of_type(recs, "run")
    assert meta["run_id"].startswith(wandb_run_id(run) + "-") and meta["run_group"] == "grp" and meta["project"] == "rrtrain-test"
    mine = [r for r in records(run) if r["step"] <= 8]
    loss = {r["step"]: r["loss"] for r in mine if "loss" in r}
    assert sorted(loss) == list(range(1, 9))
    assert history(recs, "train/loss") == pytest.approx(loss, rel=1e-6)  # every logged step, no other
    val = {r["step"]: r["val_loss"] for r in mine if "val_loss" in r}
    assert sorted(val) == [4, 8] and history(recs, "eval/val_loss") == pytest.approx(val, rel=1e-6)
    flag = next(r for r in mine if r.get("kind") == "flag")
    assert flag["flag"] == "stalled" and history(recs, "monitor/stalled") == {flag["step"]: 1}
    (alert,) = of_type(recs, "alert")
    assert alert["title"] == "stalled" and f"at step {flag['step']}: {flag['detail']}" in alert["text"]
    config: dict = {}
    for c in of_type(recs, "config"):
        config.update(c["update"])
    assert config["model"]["variant"] == "review" and config["train"]["max_steps"] == 8
    assert config["log"]["wandb"]["mode"] == "offline"
    assert (config["resolved"]["params"], config["resolved"]["total_steps"]) == (final(run)["params"], 8)
    live = next(u["update"] for u in of_type(recs, "summary") if "flag/stalled" in u["update"])
    assert live == {"flag/stalled": {"step": flag["step"], "detail": flag["detail"]}}  # as it was raised
    out = summary(recs)
    assert out["status"] == "completed" and out["flags"] == ["stalled"] and out["exit_code"] == 0
    assert out["flag_steps"] == {"stalled": flag["step"]} and out["flag_details"] == {"stalled": flag["detail"]}
    assert [x.get("exit_code", 0) for x in of_type(recs, "exit")] == [0]
    assert not (run / "wandb").exists()  # $WANDB_DIR wins over the run directory


def test_the_resumed_start_continues_the_same_wandb_run(two_starts):
    run, _, (first, second), code = two_starts
    fin = final(run)
    assert code == 4 and fin["status"] == "stalled" and "cancelled" in fin["flags"], fin
    assert of_type(second, "run")[0]["run_id"] == of_type(first, "run")[0]["run_id"]  # its own, kept in the checkpoint
    assert of_type(first, "run")[0]["run_id"].startswith(wandb_run_id(run) + "-")
    loss = {r["step"]: r["loss"] for r in records(run) if "loss" in r and r["step"] > 8}
    assert min(loss) == 9 and max(loss) == fin["step"]
    assert history(second, "train/loss") == pytest.approx(loss, rel=1e-6)  # from step 9 on: nothing twice
    assert history(second, "monitor/cancelled") == {fin["step"]: 1}
    assert "monitor/stalled" not in {k for h in of_type(second, "history") for k in h["item"]}  # raised before
    assert [a["title"] for a in of_type(second, "alert")] == ["cancelled"]
    out = summary(second)
    assert (out["status"], out["step"], out["exit_code"]) == ("stalled", fin["step"], 4)
    assert out["flags"] == fin["flags"] and out["flag_details"]["cancelled"] == "stalled (test)"
    assert out["flag/cancelled"] == {"step": fin["step"], "detail": "stalled (test)"}
    assert "flag/stalled" not in out  # the first start's: this one did not say it again
    assert [x["exit_code"] for x in of_type(second, "exit")] == [4]


def test_a_run_without_log_wandb_does_not_import_wandb(tmp_path, stories_data):
    """The run in a process of its own, forked by the tests' fork server (trainutil.spawn), which imports what
    every run imports and never wandb: what the process holds at the end is that and what this run imported."""
    argv = [TINY, f"data.path={stories_data}", f"run.dir={tmp_path / 'run'}", "train.max_steps=2",
            "train.global_batch=4", "train.micro_batch=4", "data.eval_batches=1"]
    code = ("import json, sys\nfrom rrtrain.train import main\n"
            f"rc = main({argv!r})\n"
            "print(json.dumps([rc, sorted(m for m in sys.modules if m.split('.')[0] in ('wandb', 'rrtrain'))]))\n")
    (tmp_path / "no_wandb_probe.py").write_text(code)
    cmd = [PY, "-m", "no_wandb_probe"]
    proc = spawn(cmd, env(), merge_stderr=False, cwd=tmp_path, module="no_wandb_probe")
    out, err = proc.communicate(timeout=600)
    proc = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rc, loaded = json.loads(proc.stdout.splitlines()[-1])
    assert rc == 0 and "rrtrain.training.trainer" in loaded  # it did train
    assert not [m for m in loaded if m.startswith(("wandb", "rrtrain.monitoring.wandb_logger"))], loaded


@pytest.mark.distributed
def test_two_ranks_make_one_wandb_run_in_the_run_directory(tmp_path, stories_data, monkeypatch):
    """Rank 0 alone talks to W&B; without $WANDB_DIR its files go into the run directory. The two ranks start
    as srun starts them (trainutil.train: one process each, one rendezvous)."""
    run = tmp_path / "run"
    monkeypatch.delenv("WANDB_DIR", raising=False)  # the ranks' environment is this process's (trainutil.env)
    train(run, stories_data, "train.max_steps=2", "train.global_batch=4", "train.micro_batch=2",
          "data.eval_batches=1", "log.wandb.mode=offline", nproc=2)
    (one,) = (run / "wandb").glob("offline-run-*")
    recs = inspect(next(one.glob("*.wandb")))
    assert of_type(recs, "run")[0]["run_id"].startswith(wandb_run_id(run) + "-")
    assert summary(recs)["world_size"] == 2 and sorted(history(recs, "train/loss")) == [1, 2]

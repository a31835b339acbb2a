"""Two `rrtrain sweep` on the same --out at once, with the local executor and real tiny runs: the second waits
for the first (the sweep lock), then submits only what is new. Every run trains once, sweep.json keeps both
submissions' job ids, and the code snapshot the first one's runs import survives. The two `rrtrain sweep` are
processes of their own, forked by the tests' fork server (trainutil.spawn); the runs they start are the local
executor's own fresh interpreters. Budget: about 20 s of CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainutil import PY, env, spawn

pytestmark = pytest.mark.slow


def sweep_file(tmp_path: Path, data: Path) -> Path:
    import yaml

    body = {"name": "race", "config": "tiny.yaml", "data": str(data), "variants": ["review"],
            "sizes": {"tiny": {"seeds": 1, "overrides": {"train.max_steps": 4}}},
            "overrides": {"train.global_batch": 8, "train.micro_batch": 8, "train.log_every": 1,
                          "train.eval_every": 4, "data.eval_batches": 1, "model.n_layers": 1},
            "resources": {"time_min": 10, "signal_delay_s": 30}}
    p = tmp_path / "race.yaml"
    p.write_text(yaml.safe_dump(body, sort_keys=False))
    return p


def test_two_sweeps_on_one_directory_train_each_run_once(tmp_path, stories_data):
    spec, out = sweep_file(tmp_path, stories_data), tmp_path / "sweep"
    cmd = [PY, "-m", "rrtrain", "sweep", str(spec), "--out", str(out), "--executor", "local", "--lock-wait", "300"]
    # started together: both would see an empty directory; the second asks for one more seed, so both want
    # tiny-review-s0 and one of them also tiny-review-s1
    procs = [spawn(c, env(), merge_stderr=False, module="rrtrain") for c in (cmd, cmd + ["sizes.tiny.seeds=2"])]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode == 0, stdout + stderr
    stdout = "".join(o for o, _ in outputs)
    waited = [e for _, e in outputs if "is submitting to" in e and "waiting up to 300 s (--lock-wait)" in e]
    assert len(waited) == 1, outputs  # the one that came second said so, once
    started = {line.split()[2]: line.split()[4].rstrip(",") for line in stdout.splitlines()
               if line.startswith("[local] started")}
    starts = [line.split()[2] for line in stdout.splitlines() if line.startswith("[local] started")]
    assert sorted(starts) == ["tiny-review-s0", "tiny-review-s1"], stdout  # each run trained once
    rec = json.loads((out / "sweep.json").read_text())
    recorded = {rid: job for sub in rec["submissions"] for rid, job in sub["jobs"].items()}
    assert recorded == {rid: f"local:{pid}" for rid, pid in started.items()}  # no job id lost
    assert rec["code"]["path"] == str(out / "code") and (out / "code" / "rrtrain" / "train.py").is_file()
    assert not list(out.glob("code-*")) and not list(out.glob(".code.tmp*"))  # one snapshot, taken once
    for rid in ("tiny-review-s0", "tiny-review-s1"):
        final = json.loads((out / rid / "final.json").read_text())
        assert final["status"] == "completed" and final["step"] == 4
        steps = [json.loads(line)["step"] for line in (out / rid / "metrics.jsonl").read_text().splitlines()
                 if '"loss"' in line and '"val_loss"' not in line]
        assert steps == [1, 2, 3, 4]

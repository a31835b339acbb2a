"""Two `rrtrain sweep` on the same --out at once, with the local executor and real tiny runs: the second waits
for the first (the sweep lock), then submits only what is new. Every run trains once, sweep.json keeps both
submissions' job ids, and the code snapshot the first one's runs import survives. The two `rrtrain sweep` are
processes of their own, forked by the tests' fork server (trainutil.spawn); the runs they start are the local
executor's own (forked by its warm interpreter). Budget: about 20 s of CPU."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

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


class Lines:
    """A process's output, read as it comes (a thread per stream), to wait on a line while it runs."""

    def __init__(self, proc: Any) -> None:
        self.proc, self.out, self.err = proc, [], []
        self.readers = [threading.Thread(target=lambda s=s, into=into: into.extend(s), daemon=True)
                        for s, into in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for t in self.readers:
            t.start()

    def wait_for(self, text: str, stream: str, timeout: float = 300.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in getattr(self, stream) if text in line]
            if found:
                return found[0]
            assert self.proc.poll() is None and time.monotonic() < deadline, (self.out, self.err)
            time.sleep(0.05)

    def finish(self, timeout: float = 600.0) -> tuple[str, str]:
        code = self.proc.wait(timeout=timeout)
        for t in self.readers:
            t.join(timeout)
        stdout, stderr = "".join(self.out), "".join(self.err)
        assert code == 0, stdout + stderr
        return stdout, stderr


def test_two_sweeps_on_one_directory_train_each_run_once(tmp_path, stories_data):
    spec, out = sweep_file(tmp_path, stories_data), tmp_path / "sweep"
    cmd = [PY, "-m", "rrtrain", "sweep", str(spec), "--out", str(out), "--executor", "local", "--lock-wait", "300"]
    # The first sweep holds the lock until its run ends; its run is stopped (SIGSTOP) until the second sweep, which
    # also wants tiny-review-s0 and one more seed, says it waits: the two meet at the lock whatever the machine's
    # speed. Then the first's run goes on, and the second submits only what is new.
    first = Lines(spawn(cmd, env(), merge_stderr=False, module="rrtrain"))
    run_pid = int(first.wait_for("[local] started tiny-review-s0", "out").split("(pid ")[1].split(",")[0])
    os.kill(run_pid, signal.SIGSTOP)
    try:
        second = Lines(spawn(cmd + ["sizes.tiny.seeds=2"], env(), merge_stderr=False, module="rrtrain"))
        second.wait_for("waiting up to 300 s (--lock-wait)", "err")
    finally:
        os.kill(run_pid, signal.SIGCONT)
    outputs = [first.finish(), second.finish()]
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

"""A sweep's job trusts only what Slurm holds for it (launchers.sweep.seal): the code snapshot and the run's config
are bound at submission to digests in the job's own script (the rendered array and multi-node scripts, the lines
submitit's script runs first) or in the local executor's memory, and a job whose snapshot or config changed
since is refused before anything of the sweep directory runs: one line, exit 2, final.json saying why. Under
submitit its payload too: the script submitit wrote (submitted to a stand-in sbatch) refuses a payload planted
after submission before srun starts submitit, which would unpickle it."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launchers.executors import local, slurm
from launchers.executors.entry import submitit_dir
from launchers.executors.render import render
from launchers.sweep import seal, snapshot
from launchers.sweep.expand import data_path, expand
from launchers.sweep import spec
from rrtrain.config_load import CONFIG_DIGEST_ENV
from rrtrain.core.errors import UsageError
from rrtrain.resolve import load as load_run_config

BODY = {"name": "t", "config": "tiny.yaml", "data": "/data/x", "variants": ["review", "standard"],
        "sizes": {"tiny": {"seeds": 1, "overrides": {"train.max_steps": 2}}}}


@pytest.fixture
def submitted(tmp_path):
    """A sweep as `rrtrain sweep` leaves it at submission: a code snapshot (a small stand-in tree), the configs
    written, the scripts rendered."""
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(BODY))
    sweep = spec.load(tmp_path / "sweep.yaml")
    out = tmp_path / "out"
    runs = expand(sweep, out, data_path(sweep, out))
    code = out / "code"
    (code / "rrtrain").mkdir(parents=True)
    (code / "rrtrain" / "__init__.py").write_text("")
    configs = {r.id: out / "configs" / f"{r.id}.yaml" for r in runs}
    configs[runs[0].id].parent.mkdir(parents=True)
    for r in runs:
        configs[r.id].write_text(yaml.safe_dump(r.config))
    scripts = render(out, "t", runs, sys.executable, str(code), configs)
    return out, runs, code, configs, scripts


def run_task(script: str, task: int, array_job: str = "1") -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_JOB_ID": array_job, "SLURM_JOB_ID": "99"}
    return subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def standin_slurm(tmp_path, monkeypatch) -> Path:
    """sbatch and srun stand-ins first on PATH: sbatch keeps the script it is given (as Slurm does) as
    `tmp_path/job.sbatch` and answers job 4242; srun only notes that it ran, with the config digest it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {tmp_path}/job.sbatch\necho "Submitted batch job 4242"\n')
    (bin_dir / "srun").write_text(f'#!/bin/sh\necho "$RRTRAIN_CONFIG_SHA256 $*" >> {tmp_path}/srun.log\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o700)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the key of the jobs' mark
    return tmp_path


class Planted:
    """Unpickled, it runs a shell command: what a payload planted after submission would do in submitit."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_the_seal_is_the_snapshot_hash_and_sees_every_change(submitted):
    out, runs, code, configs, _ = submitted
    assert seal.tree_hash(code) == snapshot.tree_hash(code)
    bound = seal.bind(str(code), configs)
    rid = runs[0].id
    assert seal.problem(str(code), bound.code_sha256, str(configs[rid]), bound.configs[rid]) is None
    (code / "sitecustomize.py").write_text("print('planted')\n")
    assert "not what was submitted" in seal.problem(str(code), bound.code_sha256, None, None)
    (code / "sitecustomize.py").unlink()
    configs[rid].write_text(configs[rid].read_text() + "# changed\n")
    assert "not the one submitted" in seal.problem(None, None, str(configs[rid]), bound.configs[rid])
    configs[rid].unlink()
    configs[rid].symlink_to(configs[runs[1].id])  # another run's config through a link
    assert "cannot be read" in seal.problem(None, None, str(configs[rid]), bound.configs[rid])


@pytest.mark.parametrize("swap", ["code", "config"])
def test_a_rendered_array_task_refuses_what_changed_after_submission(submitted, swap):
    out, runs, code, configs, scripts = submitted
    array = next(s["script"] for s in scripts if s["array"])
    if swap == "code":
        (code / "rrtrain" / "__init__.py").write_text("import os; os.system('echo pwned')\n")
    else:
        configs[runs[1].id].write_text(configs[runs[1].id].read_text().replace("max_steps: 2", "max_steps: 9"))
    proc = run_task(array, 1)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    refused = [line for line in proc.stderr.splitlines() if line.startswith("rrtrain: refusing")]
    assert len(refused) == 1 and ("code snapshot" if swap == "code" else "config") in refused[0], proc.stderr
    final = json.loads((runs[1].dir / "final.json").read_text())
    assert final["status"] == "failed" and "refused at its start" in final["reason"]
    assert not (runs[0].dir / "final.json").exists()  # the other task's run is untouched


def test_a_task_not_submitted_is_refused(submitted):
    *_, scripts = submitted
    proc = run_task(next(s["script"] for s in scripts if s["array"]), 7)
    assert proc.returncode == 2 and "not one this script submitted" in proc.stderr


@pytest.mark.slow  # submitit's own submission (a stand-in sbatch), then its script in bash, five times
def test_submitits_job_script_checks_the_tasks_run_and_its_payload(submitted, standin_slurm):
    out, runs, code, configs, _ = submitted
    jobs = slurm.submit(runs, out, "t", str(code))  # submitit writes the payloads and the script, as on a cluster
    assert jobs == {runs[0].id: "4242_0", runs[1].id: "4242_1"}
    script, srun = str(standin_slurm / "job.sbatch"), standin_slurm / "srun.log"
    pkl = {i: submitit_dir(out) / f"4242_{i}" / f"4242_{i}_submitted.pkl" for i in (0, 1)}
    good = run_task(script, 1, "4242")
    digest = seal.bind(str(code), configs).configs[runs[1].id]
    assert good.returncode == 0 and srun.read_text().startswith(f"{digest} "), good.stderr
    assert "submitit.core._submit" in srun.read_text()
    srun.unlink()

    def refused(why: str) -> None:
        proc = run_task(script, 1, "4242")
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("rrtrain: refusing")]
        assert len(lines) == 1 and why in lines[0], proc.stderr
        assert not srun.exists(), "srun started submitit, which would unpickle the payload"
        final = runs[1].dir / "final.json"
        assert "refused at its start" in json.loads(final.read_text())["reason"]
        final.unlink()

    marker = standin_slurm / "pwned"
    pkl[1].write_bytes(pickle.dumps(Planted(marker)))  # planted after submission
    refused(f"submitit's payload for job 4242_1 is not the call submitted (it names {os.system.__module__}.system)")
    assert not marker.exists()
    pkl[1].write_bytes(pkl[0].read_bytes())  # the other task's call
    refused("it runs another run than this task's")
    pkl[1].unlink()
    pkl[1].symlink_to(pkl[0])
    refused("submitit's payload for job 4242_1 cannot be read")
    configs[runs[0].id].write_text("train: {max_steps: 1000}\n")
    bad = run_task(script, 0, "4242")
    assert bad.returncode == 2 and "not the one submitted" in bad.stderr and not srun.exists()


def test_the_local_executor_does_not_start_a_run_whose_config_changed(submitted, monkeypatch, capsys):
    out, runs, code, configs, _ = submitted
    bound = seal.bind(str(code), configs)  # bound at submission ...
    configs[runs[0].id].write_text("train: {max_steps: 1000}\n")  # ... changed before the run's turn came
    monkeypatch.setattr(seal, "bind", lambda *_: bound)
    jobs, codes = local.submit(runs[:1], sys.executable, str(code), configs, out / "slurm" / "logs", parallel=1)
    assert codes == {runs[0].id: 2} and runs[0].id not in jobs  # never started
    assert "not the one submitted" in capsys.readouterr().err
    assert json.loads((runs[0].dir / "final.json").read_text())["status"] == "failed"


def test_the_trainer_parses_only_the_bytes_of_the_bound_digest(submitted):
    _, runs, _, configs, _ = submitted
    bound = seal.bind(str(submitted[2]), configs)
    rid = runs[0].id
    assert load_run_config(configs[rid], sha256=bound.configs[rid]).train.max_steps == 2
    configs[rid].write_text(configs[rid].read_text().replace("max_steps: 2", "max_steps: 3"))
    with pytest.raises(UsageError, match="not the config this run was submitted with"):
        load_run_config(configs[rid], sha256=bound.configs[rid])
    assert seal.CONFIG_DIGEST_ENV == CONFIG_DIGEST_ENV


def test_a_refusal_never_replaces_a_recorded_ending(tmp_path):
    (tmp_path / "final.json").write_text('{"status": "completed"}')
    seal.record_refusal(str(tmp_path), "changed")
    assert json.loads((tmp_path / "final.json").read_text()) == {"status": "completed"}
    assert os.listdir(tmp_path) == ["final.json"]

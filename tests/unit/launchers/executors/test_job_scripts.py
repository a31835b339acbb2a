"""What the sbatch scripts do once their run ended, asked of the job side's program (`seal.py ended`, `started`,
`field`) rather than read by the shell: a run the time-limit warning stopped at a step boundary is requeued
(also when torchrun's exit status hides the 75 and only final.json says `preempted`), a TERM's is not, and a run
cancelled as flagged (`cancelled.json`) is not, by slurm/array.sbatch (rendered, the program from its text, and
by hand) and by slurm/multinode.sbatch alike. The scripts run in bash with stand-ins for scontrol, srun and
scancel first on PATH; the run is a shell line that writes final.json and signals the batch shell as Slurm
would. Slow tier: each case is a bash job script and one or two Python starts (about 0.3 s)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launchers.executors.render import TEMPLATES, _fill, heredoc, render
from launchers.sweep import seal, spec
from launchers.sweep.expand import data_path, expand

PREEMPTED = '{"status": "preempted"}'


@pytest.fixture
def standins(tmp_path) -> Path:
    """scontrol (prints node1 for `show hostnames`, notes every requeue), srun and scancel stand-ins, in a
    directory to put first on PATH. srun is the multi-node run: it makes the agents' log directory it is given
    (as torchrun's agent does) and notes it in agent_logs.txt with its parent's mode, then final.json `preempted`,
    then the signal STANDIN_SIGNAL to the batch shell, then exit 1 (torchrun's status when a rank exited 75)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {
        "scontrol": f'#!/bin/sh\n[ "$1" = show ] && {{ echo node1; exit 0; }}\n'
                    f'echo "$*" >> {tmp_path}/scontrol.log\n',
        "srun": "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in --log-dir=*) d=\"${a#--log-dir=}\"; mkdir -p \"$d\"; "
                f"echo \"$d $(stat -c %a \"$(dirname \"$d\")\") $PYTHONSAFEPATH\" > {tmp_path}/agent_logs.txt;; esac; done\n"
                f"printf '{PREEMPTED}' > \"$RRTRAIN_RUN_DIR/final.json\"\n"
                "kill -$STANDIN_SIGNAL $PPID\nexit 1\n",
        "scancel": "#!/bin/sh\nexit 0\n",
    }
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o700)
    return bin_dir


def run_script(script: Path, standins: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PATH": f"{standins}{os.pathsep}{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=full, timeout=60)


def array_script(tmp_path: Path, run_dir: Path, command: str, rendered: bool) -> tuple[Path, list[str]]:
    """slurm/array.sbatch with one row running `command`: rendered as `rrtrain sweep` renders it (the row and the
    job side's program in the script's text), or as submitted by hand (a manifest; the argument to pass)."""
    row = f"r0\t{run_dir}\t{command}"
    script = tmp_path / "array.sbatch"
    template = (TEMPLATES / "array.sbatch").read_text()
    if rendered:
        variables = ['MANIFEST="${1:-}"', "MAX_REQUEUES=3", f"PYTHON={sys.executable}", *heredoc("ROWS", row),
                     *heredoc("RRTRAIN_SEAL", seal.inline_source(), export=True)]
        script.write_text(_fill(template, ["#SBATCH --requeue"], variables))
        return script, []
    script.write_text(template)
    (tmp_path / "manifest.tsv").write_text(row + "\n")
    return script, [str(tmp_path / "manifest.tsv")]


@pytest.mark.slow
@pytest.mark.parametrize("rendered, signal, cancelled, requeued, status", [
    (True, "USR2", False, True, 0),  # the time-limit warning: requeued
    (True, "USR2", True, False, 75),  # cancelled as flagged: ends checkpointed, not requeued
    (True, "TERM", False, False, 143),  # scancel or a preemption: not requeued by the script
    (False, "USR2", False, True, 0),  # by hand: the same program, imported by RRTRAIN_PYTHON
])
def test_an_array_task_requeues_only_a_time_limited_run_not_cancelled(tmp_path, standins, rendered, signal,
                                                                      cancelled, requeued, status):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if cancelled:
        (run_dir / "cancelled.json").write_text("{}")
    # the run: final.json `preempted`, the signal to the batch shell, then exit 1 (or the TERM it forwards)
    command = f"printf '{PREEMPTED}' > {run_dir}/final.json; kill -{signal} $PPID; exit 1"
    script, args = array_script(tmp_path, run_dir, command, rendered)
    env = {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "31", "RRTRAIN_PYTHON": sys.executable,
           "RRTRAIN_MAX_REQUEUES": "3"}
    proc = run_script(script, standins, env, *args)
    log = tmp_path / "scontrol.log"
    assert proc.returncode in ((status,) if status != 143 else (1, 143)), proc.stdout + proc.stderr
    assert (log.read_text() == "requeue 31_0\n") if requeued else not log.exists(), proc.stdout + proc.stderr
    assert ("cancelled as flagged" in proc.stderr) == cancelled and "warning" not in proc.stderr, proc.stderr


def multinode_script(tmp_path: Path, rendered: bool) -> tuple[Path, Path, str]:
    """(script, run directory, config argument): slurm/multinode.sbatch as `rrtrain sweep` renders it for a
    2-node run (render(): the digests, the rendezvous drawn, the job side's program in its text), or the
    template as submitted by hand."""
    if not rendered:
        (tmp_path / "run").mkdir()
        return TEMPLATES / "multinode.sbatch", tmp_path / "run", "config.yaml"
    body = {"name": "t", "config": "tiny.yaml", "data": "/data/x", "variants": ["review"],
            "sizes": {"tiny": {"seeds": 1}}, "resources": {"nodes": 2}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(body))
    sweep = spec.load(tmp_path / "sweep.yaml")
    out = tmp_path / "out"
    run = expand(sweep, out, data_path(sweep, out))[0]
    code, config = out / "code", out / "configs" / f"{run.id}.yaml"
    for path, text in ((code / "rrtrain" / "__init__.py", ""), (config, yaml.safe_dump(run.config))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    [entry] = render(out, "t", [run], sys.executable, str(code), {run.id: config})
    run.dir.mkdir(parents=True)
    return Path(entry["script"]), run.dir, str(config)


@pytest.mark.slow
@pytest.mark.parametrize("rendered, cancelled", [(False, False), (False, True), (True, True)])
def test_a_multinode_job_honours_cancelled_json(tmp_path, standins, rendered, cancelled):
    script, run_dir, config = multinode_script(tmp_path, rendered)
    if cancelled:
        (run_dir / "cancelled.json").write_text("{}")
    job = str(10**8 + secrets.randbelow(10**8))
    env = {"SLURM_JOB_ID": job, "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]", "STANDIN_SIGNAL": "USR2",
           "RRTRAIN_PYTHON": sys.executable, "RRTRAIN_RUN_DIR": str(run_dir), "RDZV_DIR": str(tmp_path / "rdzv")}
    # the agents' logs: by hand, in RRTRAIN_AGENT_DIR; rendered, in the sweep's own slurm directory
    agent_dir = tmp_path / "agents" if not rendered else script.parent / "torchrun"
    if not rendered:
        env["RRTRAIN_AGENT_DIR"] = str(agent_dir)
    proc = run_script(script, standins, env, config)
    out, log = proc.stdout + proc.stderr, tmp_path / "scontrol.log"
    logs, mode, safe_path = (tmp_path / "agent_logs.txt").read_text().split()
    # a directory of the job's own (700, a drawn name) in AGENT_DIR, never a name in /tmp; gone once the job ended
    assert Path(logs).parent.parent == agent_dir and Path(logs).parent.name.startswith(f"{job}-0."), logs
    assert mode == "700" and not Path(logs).parent.exists() and safe_path == "1", (logs, mode, safe_path)
    port = re.search(r"rendezvous node1:(\d+),", proc.stdout)  # read from the rendezvous file by the program
    assert port and 20000 <= int(port.group(1)) < 32768, out
    if cancelled:
        assert proc.returncode == 75 and not log.exists(), out
        assert "rrtrain multinode: cancelled as flagged (rrtrain sweep --cancel-flagged): not requeued" in out
    else:
        assert proc.returncode == 0 and log.read_text() == f"requeue {job}\n", out
    assert json.loads((run_dir / "final.json").read_text()) == {"status": "preempted"}
    assert "warning" not in proc.stderr and "refusing" not in proc.stderr, out


def test_the_scripts_read_no_json_themselves():
    for name in ("array.sbatch", "multinode.sbatch"):
        text = (TEMPLATES / name).read_text()
        code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if re.search(r"\b(grep|sed|awk|jq|cut)\b.*json", line)], name


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["file", "group-writable", "link"])
def test_a_multinode_job_refuses_an_agent_dir_others_control(tmp_path, standins, planted):
    """Where the torchrun agents' logs go is the user's alone: a file in the way, a directory others can write
    or a link (what a co-tenant plants at a name in a shared directory) ends the job at its start in one line,
    before srun, and nothing is written there."""
    script, run_dir, config = multinode_script(tmp_path, rendered=False)
    agent_dir = tmp_path / "agents"
    if planted == "file":
        agent_dir.write_text("")
    elif planted == "group-writable":
        agent_dir.mkdir()
        agent_dir.chmod(0o770)
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        agent_dir.symlink_to(tmp_path / "elsewhere")
    env = {"SLURM_JOB_ID": "41", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]", "STANDIN_SIGNAL": "USR2",
           "RRTRAIN_PYTHON": sys.executable, "RRTRAIN_RUN_DIR": str(run_dir), "RDZV_DIR": str(tmp_path / "rdzv"),
           "RRTRAIN_AGENT_DIR": str(agent_dir)}
    proc = run_script(script, standins, env, config)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 2 and len(errors) == 1 and "RRTRAIN_AGENT_DIR" in errors[0], proc.stderr
    assert not (tmp_path / "agent_logs.txt").exists() and not (run_dir / "final.json").exists(), proc.stderr
    assert planted != "link" or not any((tmp_path / "elsewhere").iterdir())


def test_the_scripts_use_no_predictable_name_in_a_shared_directory():
    """No name in /tmp, /var/tmp or /dev/shm in the scripts' code (a co-tenant can make it first), and every
    Python they start keeps the current directory off its import path (PYTHONSAFEPATH)."""
    for name in ("array.sbatch", "multinode.sbatch"):
        text = (TEMPLATES / name).read_text()
        code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if re.search(r"/(tmp|var/tmp|dev/shm)\b", line)], name
        assert "export PYTHONSAFEPATH=1" in code, name

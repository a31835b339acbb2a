"""slurm/multinode.sbatch on two nodes of the local cluster (a torchrun agent and one rank per node): the
time-limit warning goes to the batch shell (`--signal=B:USR2`, sent here with `scancel --batch --signal=USR2`),
which forwards it as TERM through srun to the agents and their ranks. The ranks checkpoint collectively, the
script requeues the 2-node job, and the run resumes and finishes exactly, instead of USR2 killing the torchrun
agents and losing the step."""

from __future__ import annotations

import subprocess
import time

from slurmutil import NODES, REPO, cancel, restarts, sbatch, squeue, wait_done
from trainutil import PY, TINY, env, final, free_port, losses, records

STEPS = 120
ARGS = [f"train.max_steps={STEPS}", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
        "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=2", "parallel.backend=fsdp"]


def test_usr2_to_the_batch_shell_is_forwarded_checkpoints_and_requeues(slurm_cluster, tmp_path, stories_data):
    run, log = tmp_path / "run", tmp_path / "job.log"
    e = env()
    e.update(RRTRAIN_PYTHON=PY, RRTRAIN_RUN_DIR=str(run), RDZV_PORT=str(free_port()))
    job = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1", "--cpus-per-task=1",
                 "--time=10", f"--output={log}", "--job-name=rr-multinode",
                 args=(TINY, f"data.path={stories_data}", f"run.dir={run}", *ARGS), env=e)
    try:
        deadline = time.time() + 240
        while max(losses(run), default=0) < 10:
            assert time.time() < deadline and squeue(job).get(job) in {"PENDING", "CONFIGURING", "RUNNING"}, \
                (squeue(job), log.read_text() if log.exists() else "")
            time.sleep(0.1)
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, capture_output=True, timeout=30)
        states = wait_done(job, timeout=300)
    finally:
        cancel(job)
    text = log.read_text()
    assert states == {job: "COMPLETED"}, text[-4000:]
    assert restarts(job) == 1, text[-4000:]
    assert "checkpointed" in text and "requeueing" in text, text[-4000:]
    resumed = int(text.split("resumed at step ")[1].split()[0])
    assert 10 <= resumed < STEPS
    fin = final(run)
    assert fin["status"] == "completed" and fin["step"] == STEPS
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1))

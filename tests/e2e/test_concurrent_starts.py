"""Runs that share a node start cleanly however they meet there: eight training runs started together against
one dataset, ten times over, all train, while another program on the machine opens streaming datasets all along
without rrtrain's lock (another user's job, a script using streaming directly).

What can go wrong is streaming's choice of a shared-memory prefix: it checks which names exist and then creates
one, so two processes that look at the same moment take the same prefix (`FileExistsError: '/000015_locals'`).
rrtrain's runs serialise that under the user's lock (`rrtrain.data.shm.shm_guard`); the other program does not
take it, and a prefix it took first must be a retry for our runs, not a crash (`register_prefix`)."""

from __future__ import annotations

import subprocess

import pytest

from trainutil import PY, REPO, env, final, start

RUNS, ROUNDS = 8, 10

#: the smallest run that opens both of its splits, trains and checkpoints
TINY = ("model.size=micro", "train.max_steps=1", "train.compile=false", "train.global_batch=2", "train.micro_batch=2",
        "data.eval_batches=1", "train.eval_every=1000", "train.log_every=1")

#: another program on the machine: opens the dataset with streaming itself, in a new process each time (whose
#: exit unlinks its names, without any lock), until its stdin closes; a race it loses is its own problem (it
#: counts them: a job that lost one). A job exits as Python does up to the point where its names are gone (its
#: threads' exit hooks and joins, then the atexit hooks, streaming's unlinks among them); the interpreter's
#: teardown after that, which only frees memory, is left out: in a child of a process holding torch's modules
#: it took about a second of CPU per job, ten times the rest of the job.
FOREIGN = """
import atexit, os, random, select, sys, threading, time
from rrtrain.core.lazy_import import streaming_module  # streaming's modules only, without transformers
StreamingDataset = streaming_module("streaming.base.dataset").StreamingDataset
from multiprocessing import resource_tracker
resource_tracker.ensure_running()  # one tracker for every child, not one started by each
opened = lost = 0
print("ready", flush=True)
for _ in range(100000):
    if select.select([sys.stdin], [], [], 0)[0]:
        break
    pid = os.fork()
    if pid == 0:
        try:  # a job with three datasets (its exit, not its opens, is what takes its time)
            held = [StreamingDataset(local=sys.argv[1], split="train", batch_size=1)  # not through rrtrain
                    for _ in range(3)]
            held[-1][0]
        except Exception:
            sys.exit(3)
        threading._shutdown()
        atexit._run_exitfuncs()
        os._exit(0)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    opened, lost = opened + (code == 0), lost + (code != 0)
    time.sleep(random.uniform(0, 0.5))  # a neighbour, not a fork bomb: the runs need the cores too
print(opened, lost, flush=True)
"""


@pytest.mark.slow
def test_eight_runs_started_together_train_beside_a_program_that_takes_no_lock(stories_data, tmp_path):
    foreign_tmp = tmp_path / "foreign-tmp"  # streaming's file locks of the other program's own
    foreign_tmp.mkdir()
    foreign = subprocess.Popen([PY, "-c", FOREIGN, str(stories_data)], cwd=REPO, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**env(), "TMPDIR": str(foreign_tmp)})
    try:
        assert foreign.stdout.readline().strip() == "ready", foreign.stderr.read()
        for round_ in range(ROUNDS):
            runs = [tmp_path / f"round{round_}-run{i}" for i in range(RUNS)]
            procs = [start(run, stories_data, *TINY) for run in runs]
            failed = []
            for run, proc in zip(runs, procs):
                out, _ = proc.communicate(timeout=600)
                if proc.returncode != 0:
                    failed.append(f"{run.name}: exit {proc.returncode}: {out.strip().splitlines()[-3:]}")
            assert not failed, f"round {round_}: " + "; ".join(failed)
            assert all(final(run)["status"] == "completed" for run in runs)
    finally:
        counts, err = foreign.communicate(timeout=120)  # closes its stdin: it stops
    opened, lost = (int(n) for n in counts.split())
    print(f"the other program: {opened} jobs opened three datasets each meanwhile, {lost} lost a race")
    assert opened > 0, f"the other program never opened the dataset meanwhile (lost {lost}): {err[-2000:]}"

"""A lost rank under srun/submitit-style launching (separate processes, one rendezvous, no torchrun): the
survivor exits within parallel.timeout_s plus a small margin with one message naming the missing rank, and
rank 0 (when it survives) leaves final.json. A rank that hangs (SIGSTOP: alive, silent) is named the same
way instead of being waited for. Budget: about 60 s."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from trainutil import final, start_ranks, wait_for_step

TIMEOUT_S = 20
MARGIN_S = 15


@pytest.mark.parametrize("how,victim", [("kill", 1), ("kill", 0), ("stop", 1)])
def test_survivor_names_the_lost_rank(tmp_path, stories_data, how, victim):
    run = tmp_path / "run"
    procs = start_ranks(run, stories_data, "train.max_steps=100000", "train.micro_batch=8", "parallel.backend=fsdp",
                        f"parallel.timeout_s={TIMEOUT_S}", "train.log_every=1", "train.ckpt_every=0",
                        "train.eval_every=0", "train.compile=false")  # "auto" would compile a run this long
    survivor = procs[1 - victim]
    try:
        wait_for_step(run, 3, procs[0], timeout=240)
        procs[victim].send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = survivor.communicate(timeout=TIMEOUT_S + MARGIN_S)
        took = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        raise AssertionError(f"rank {1 - victim} still running {TIMEOUT_S + MARGIN_S} s after rank {victim} was lost")
    finally:
        for p in procs:
            p.kill()  # SIGKILL ends a stopped process too
            p.communicate()
    assert survivor.returncode == 1, err
    assert "Traceback" not in err, err
    assert f"error: rank {victim} of 2 stopped responding" in err, err
    print(f"rank {1 - victim} exited {took:.1f} s after rank {victim} got SIG{how.upper()} (timeout_s={TIMEOUT_S})")
    if victim == 1:
        fin = final(run)
        assert fin["status"] == "failed" and "rank 1 of 2 stopped responding" in fin["reason"]

"""Runs that open their datasets at the same moment on one machine (a sweep's parallel runs, a job array) do not
collide in streaming's shared-memory names (`rrtrain.data.loader.shm_guard`). Without the guard, 2-3 of 6 such
processes failed with `FileExistsError: '/0001xx_locals'` on this machine."""

from __future__ import annotations

import subprocess

from trainutil import PY, REPO, env

OPEN_BOTH = """
import sys, rrtrain.data.loader as D
D.TrainLoader(sys.argv[1], micro_batch=2, global_batch=2, rank=0, world_size=1, local_rank=0, seed=0,
              cache_dir=sys.argv[2])
D.eval_batches(sys.argv[1], micro_batch=2, n_batches=1, rank=0, world_size=1, cache_dir=sys.argv[2])
"""


def test_loaders_started_together_do_not_collide(stories_data, tmp_path):
    procs = [subprocess.Popen([PY, "-c", OPEN_BOTH, str(stories_data), str(tmp_path / f"cache{i}")], cwd=REPO,
                              env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(6)]
    failures = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            failures.append(err.strip().splitlines()[-1])
    assert not failures, failures


def test_stale_names_beyond_a_gap_are_unlinked(tmp_path):
    """Streaming's cleaner stops at the first free prefix; ours removes leaked names above gaps too, and only
    streaming's names."""
    from rrtrain.data.loader import unlink_stale_beyond_gaps

    for name in ("000007_locals", "000007_barrier", "000012_shard_states", "000012_cache_usage"):
        (tmp_path / name).write_bytes(b"x")
    for keep in ("rrtrain-streaming.lock", "000003_not_streaming", "psm_1234"):
        (tmp_path / keep).write_bytes(b"x")
    assert unlink_stale_beyond_gaps(str(tmp_path)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000003_not_streaming", "psm_1234",
                                                          "rrtrain-streaming.lock"]

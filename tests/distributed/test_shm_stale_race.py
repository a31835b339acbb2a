"""Two ranks of one run open their dataset while a dead run's shared memory lies in /dev/shm (a requeue after
SIGKILL, the chaos test): the local leader unlinks it, and no rank may look for a free streaming prefix before
the leader is done. One did: its look mapped the dead names (streaming keeps what it opens until exit), so the
leader judged them alive and left them for good, and a look that raced the leader's unlinking could take
another prefix than the leader registered ("shared memory prefix=N was not registered by local leader")."""

from __future__ import annotations

import pytest

from distributed.rankutil import run_ranks

pytestmark = pytest.mark.distributed


def test_no_rank_looks_for_a_prefix_while_the_leader_unlinks_dead_ones(stories_data, tmp_path):
    proc = run_ranks("tests.distributed.shm_stale_worker", [str(stories_data), str(tmp_path / "cache")], 2,
                     timeout=300)  # srun-style ranks, forked by the tests' fork server
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "opened 0" in out and "opened 1" in out

"""The loader on 2 real ranks (CPU/gloo; srun-style ranks forked by the tests' fork server, which has opened no
loader: tests/distributed/rankutil.py): same step sets as one process, exact resume mid-epoch, across and exactly
at an epoch boundary, in new processes; a state written by one process continues exactly on 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from distributed.rankutil import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

N, G = 204, 8  # an epoch is 25.5 steps: step 26 straddles the boundary, step 51 ends exactly at 2 N


def _write_ids(out: Path, n: int) -> None:
    """Row i holds i everywhere (so batch[:, 0] names the sample), via the real writer and manifest."""
    from data_prep.manifest import build_manifest, dataset_fingerprint, write_manifest
    from data_prep.writer import SplitWriter

    splits = {}
    for split, count in (("train", n), ("val", 16)):
        w = SplitWriter(str(out / split), 8, np.dtype(np.uint16), compression=None, size_limit=2048,
                        vocab_size=65536, count_tokens=False)
        w.write_rows(np.repeat(np.arange(count, dtype=np.uint16)[:, None], 8, axis=1))
        w.close()
        splits[split] = {"samples": count, "tokens": count * 8, "documents": count, "dropped_tokens": 0}
    write_manifest(str(out), build_manifest(
        source="ids", source_fingerprint="ids", tokenizer="byte", tokenizer_hash="ids", tokenizer_file=None,
        vocab_size=65536, eos_id=0, seq_len=7, dtype="uint16", compression=None, splits=splits, unigram_entropy=0.0,
        seed=0, val_fraction=0.1, min_val_samples=1, fingerprint=dataset_fingerprint(str(out), "ids", 7),
        documents_skipped_empty=0))


def _ranks(tmp_path: Path, name: str, plan: dict) -> dict:
    """Run `plan` on 2 ranks of tests/distributed/loader_worker.py; rank 0's results."""
    plan_path, out_path = tmp_path / f"{name}.plan.json", tmp_path / f"{name}.out.json"
    plan_path.write_text(json.dumps(plan))
    proc = run_ranks("tests.distributed.loader_worker", [str(plan_path), str(out_path)], 2, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out_path.read_text())


def _one_process(data: Path, tmp_path: Path, steps: int, state=None, allow_change=False) -> tuple[list, dict]:
    from rrtrain.data.loader import TrainLoader

    ld = TrainLoader(str(data), micro_batch=8, global_batch=G, rank=0, world_size=1, local_rank=0, seed=5,
                     cache_dir=str(tmp_path / "one_cache"))
    if state is not None:
        ld.load_state_dict(state, allow_change=allow_change)
    it = iter(ld)
    out, states = [], {}
    for step in range(1, steps + 1):
        out.append(sorted(next(it)[:, 0].tolist()))
        states[step] = ld.state_dict()
    ld.close()
    return out, states


def test_two_ranks_resume_exactly_and_match_one_process(tmp_path):
    data = tmp_path / "data"
    _write_ids(data, N)
    base = {"data": str(data), "cache": str(tmp_path / "cache"), "micro": 2, "global_batch": G, "seed": 5}
    first = _ranks(tmp_path, "first", {**base, "jobs": [{"name": "full", "steps": 60, "save_at": [12, 25, 51]}]})
    full = first["full"]
    one, one_states = _one_process(data, tmp_path, 60)
    assert full["steps"] == one  # 2 ranks x 2 micro x 2 accumulation == 1 rank x 8, step by step
    assert [full["states"][k]["epoch"] for k in ("12", "25", "51")] == [0, 0, 2]
    assert full["states"]["51"]["sample_in_epoch"] == 0

    jobs = [{"name": f"from{k}", "steps": 60 - k, "resume": full["states"][str(k)]} for k in (12, 25, 51)]
    jobs += [{"name": "from_one_process", "steps": 8, "resume": one_states[12]}]  # world size 1 -> 2: no consent
    second = _ranks(tmp_path, "second", {**base, "jobs": jobs})
    for k in (12, 25, 51):
        assert second[f"from{k}"]["error"] is None
        assert second[f"from{k}"]["steps"] == full["steps"][k:], k
    assert second["from_one_process"]["error"] is None
    assert second["from_one_process"]["steps"] == full["steps"][12:20]

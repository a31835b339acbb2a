"""metrics.jsonl as readers see it: a fresh start empties the file in place of the old one (a reader never
finds it missing: `rrtrain status`, the sweep monitor and the chaos test poll it while runs restart), and a
resume keeps exactly the lines up to the checkpoint's step."""

from __future__ import annotations

import json
import threading

from rrtrain.rundir.metrics import MetricsLogger


def test_a_fresh_start_replaces_the_file_and_a_reader_never_finds_it_missing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    missing, stop = [], threading.Event()

    def read_all_the_time() -> None:
        while not stop.is_set():
            try:
                path.read_text()
            except FileNotFoundError:
                missing.append(1)

    path.write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n")
    reader = threading.Thread(target=read_all_the_time)
    reader.start()
    try:
        for step in range(5):
            logger = MetricsLogger(tmp_path, enabled=True)
            assert path.read_text() == ""  # the old run's lines are gone
            logger.log({"step": 1, "loss": float(step)})
            logger.close()
    finally:
        stop.set()
        reader.join()
    assert not missing, f"a reader found metrics.jsonl missing {len(missing)} times"
    assert [json.loads(line)["loss"] for line in path.read_text().splitlines()] == [4.0]


def test_a_resume_keeps_the_lines_up_to_its_step(tmp_path):
    lines = [{"step": s, "loss": float(s)} for s in range(1, 6)] + [{"step": 3, "val_loss": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 6, "lo')
    MetricsLogger(tmp_path, enabled=True, resume_step=3).close()
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [r for r in lines if r["step"] <= 3]

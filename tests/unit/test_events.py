"""rrtrain's own TensorBoard event files (rrtrain.rundir.events), read back with TensorBoard's loader."""

from __future__ import annotations

import os

import pytest

from rrtrain.rundir import events


def test_crc32c_is_the_castagnoli_checksum():
    assert events.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert events.crc32c(b"") == 0


def test_tensorboard_reads_back_every_event(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    path = tmp_path / events.new_name()
    out = events.EventFile(path)
    out.append([events.event(events.scalars({"train/loss": 2.5, "train/lr": 1e-3}), 1),
                events.event(events.scalars({"train/loss": 2.25}), 2),
                events.event(events.text("monitor/flags", "**stalled** at step 2"), 2)])
    out.append([events.restart(2), events.event(events.scalars({"train/loss": 2.0}), 2)])
    raw = list(EventFileLoader(str(path)).Load())
    assert raw[0].file_version == events.FILE_VERSION and len(raw) == 6 and out.events == 5
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 2.5), (2, 2.0)]  # the restart purged 2.25
    assert acc.Tags()["tensors"] == ["monitor/flags/text_summary"]


def test_a_fifo_at_the_name_is_refused_not_waited_on(tmp_path):
    path = tmp_path / "events.out.tfevents.1.host"
    os.mkfifo(path)
    with pytest.raises(OSError):  # ENXIO (no reader) or "not a regular file" (a reader): never a blocked write
        events.EventFile(path).append([events.restart(0)])

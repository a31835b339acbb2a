"""rrtrain's own TensorBoard event files (rrtrain.rundir.events), read back with TensorBoard's loader."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rrtrain.rundir import events
from trainutil import REPO


def test_the_framing_checksum_is_castagnoli():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c  # what RecordWriter frames with

    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert crc32c(b"") == 0


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


# Records that the hand-written framing produced before TensorBoard's RecordWriter replaced it: an empty payload,
# and a scalar event at a fixed wall time. The same bytes before and after mean that old and new files read alike.
EMPTY_RECORD = "000000000000000029039807d8ea82a2"
SCALAR_RECORD = "200000000000000029eda9500900001040fc54d94110072a130a110a0a747261696e2f6c6f737315000020409b044a25"


def test_a_record_is_framed_byte_for_byte_as_before_and_as_tensorboard_frames_it(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    scalar = events.event(events.scalars({"train/loss": 2.5}), 7, wall_time=1700000000.25)
    assert events.frame([b""]).hex() == EMPTY_RECORD
    assert events.frame([scalar.SerializeToString()]).hex() == SCALAR_RECORD

    path = tmp_path / events.new_name()
    out = events.EventFile(path)
    appended = [scalar, events.event(events.text("monitor/flags", "note"), 8, wall_time=1.5), events.restart(9)]
    out.append(appended[:1])
    out.append(appended[1:])
    payloads = list(RawEventFileLoader(str(path)).Load())  # TensorBoard's reader checks both checksums
    written = [Event.FromString(p) for p in payloads]
    assert written[0].file_version == events.FILE_VERSION
    assert written[1:] == appended  # exactly the events appended
    with open(tmp_path / "by_tensorboard", "wb") as f:  # TensorBoard's writer framing the same events
        writer = RecordWriter(f)
        for payload in payloads:
            writer.write(payload)
    assert path.read_bytes() == (tmp_path / "by_tensorboard").read_bytes()


def test_each_append_is_one_write_of_whole_records(tmp_path, monkeypatch):
    path = tmp_path / events.new_name()
    out = events.EventFile(path)
    before = path.stat().st_size
    sizes = []
    real_write = os.write

    def counted(fd, data):
        sizes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counted)
    out.append([events.event(events.scalars({"train/loss": float(i), "train/lr": 1e-3}), i) for i in range(5)])
    assert sizes == [path.stat().st_size - before]  # one write, the whole batch


def test_tensorboard_reads_the_same_scalars_and_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = {1: {"train/loss": 3.0, "eval/loss": 3.5}, 2: {"train/loss": 2.75}, 3: {"train/loss": 0.1}}
    out = events.EventFile(tmp_path / events.new_name())
    out.append([events.event(events.scalars(v), step) for step, v in values.items()])
    out.append([events.event(events.text("monitor/flags", "**spike** at step 3"), 3)])
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 3.0), (2, 2.75), (3, pytest.approx(0.1))]
    assert [(e.step, e.value) for e in acc.Scalars("eval/loss")] == [(1, 3.5)]
    (flag,) = acc.Tensors("monitor/flags/text_summary")
    assert (flag.step, flag.tensor_proto.string_val) == (3, [b"**spike** at step 3"])
    assert acc.SummaryMetadata("monitor/flags/text_summary").plugin_data.plugin_name == "text"


def test_a_symbolic_link_at_the_name_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"kept")
    (tmp_path / "tb").mkdir()
    link = tmp_path / "tb" / "events.out.tfevents.1.host"
    link.symlink_to(target)
    with pytest.raises(OSError):
        events.EventFile(link).append([events.restart(0)])
    assert target.read_bytes() == b"kept"


def test_writing_an_event_file_imports_no_torch(tmp_path):
    script = ("import sys; from pathlib import Path; from rrtrain.rundir import events; "
              "f = events.EventFile(Path(sys.argv[1]) / events.new_name()); "
              "f.append([events.event(events.scalars({'a': 1.0}), 1)]); "
              "import tensorboard.summary.writer.record_writer; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          check=True, cwd=REPO)
    assert done.stdout.strip() == "False"

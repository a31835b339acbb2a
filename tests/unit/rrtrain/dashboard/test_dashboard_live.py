"""The live dashboard's logdir (rrtrain.dashboard.live, kept by tensorboard.LiveLogdir): each refresh appends only
what is new (read back with TensorBoard's own EventAccumulator: every step once), a torn last line waits, flags
become text and markers, a changed outcome is a new HParams session, a run that starts later is added."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rrtrain.core.io import atomic_write_text
from rrtrain.dashboard.live import SUFFIX
from rrtrain.dashboard.tensorboard import LiveLogdir, build_logdir
from sweeputil import write_record


def make_run(path: Path, size: str, variant: str, steps: range) -> None:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"model": {"size": size, "variant": variant},
                                                      "train": {"seed": 0}}))
    add(path, steps)


def lines(steps: range) -> bytes:
    out = []
    for s in steps:
        out.append({"step": s, "loss": 5.0 - 0.1 * s, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64 * s})
        if s % 3 == 0:
            out.append({"step": s, "val_loss": 5.0 - 0.1 * s})
            out.append({"kind": "diag", "step": s, "gate_mean": [0.5], "gate_hist": [[0, 3, 1, 0]]})
    return b"".join((json.dumps(x) + "\n").encode() for x in out)


def add(path: Path, steps: range) -> None:
    with open(path / "metrics.jsonl", "ab") as f:
        f.write(lines(steps))


def accumulate(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = run_dir.glob(f"*{SUFFIX}")
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def steps(acc, tag: str) -> list[int]:
    return [e.step for e in acc.Scalars(tag)]


def start(sweep: Path) -> tuple[Path, LiveLogdir]:
    state: list[LiveLogdir] = []
    logdir, _ = build_logdir(sweep, state)
    return logdir, state[0]


def test_each_refresh_appends_only_what_is_new(tmp_path):
    sweep = tmp_path / "sweep"
    run = sweep / "tiny-review-s0"
    make_run(run, "tiny", "review", range(1, 4))
    logdir, kept = start(sweep)
    out = logdir / "tiny" / "review" / "seed0"
    assert steps(accumulate(out), "tiny/train_loss") == [1, 2, 3]
    derived = next(out.glob(f"*{SUFFIX}"))
    size = derived.stat().st_size
    assert kept.refresh() == 0 and derived.stat().st_size == size  # nothing new: nothing written

    add(run, range(4, 7))
    torn = json.dumps({"step": 7, "loss": 4.3}).encode()
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(torn[:9])  # the trainer is mid-line
    assert kept.refresh() == 1
    acc = accumulate(out)
    assert steps(acc, "tiny/train_loss") == [1, 2, 3, 4, 5, 6]  # each step once; step 7 waits
    assert steps(acc, "tiny/val_loss") == [3, 6] and steps(acc, "tiny/gate_mean/000") == [3, 6]
    assert [e.step for e in acc.Histograms("gates/000")] == [3, 6]
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(torn[9:] + b"\n")
    kept.refresh()
    assert steps(accumulate(out), "tiny/train_loss") == [1, 2, 3, 4, 5, 6, 7]
    assert derived.stat().st_size > size and len(list(out.glob(f"*{SUFFIX}"))) == 1  # one file, appended


def test_flags_outcome_and_a_run_that_starts_later(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    sweep = tmp_path / "sweep"
    run = sweep / "tiny-review-s0"
    make_run(run, "tiny", "review", range(1, 4))
    logdir, kept = start(sweep)
    out = logdir / "tiny" / "review" / "seed0"
    assert [p.name for p in out.iterdir() if p.is_dir()] == ["running"]

    with open(run / "metrics.jsonl", "ab") as f:
        f.write(lines(range(4, 6)) + (json.dumps({"kind": "flag", "flag": "stalled", "step": 5,
                                                   "detail": "loss flat for 3 windows"}) + "\n").encode())
    atomic_write_text(run / "final.json", json.dumps({"status": "stalled", "step": 5, "flags": ["stalled"],
                                                      "variant": "review", "size": "tiny", "seed": 0,
                                                      "final_val_loss": 4.6}))
    make_run(sweep / "tiny-standard-s0", "tiny", "standard", range(1, 3))  # started after the dashboard
    make_run(sweep / "rr-60m-review-s0", "rr-60m", "review", range(1, 2))  # ... and a new size
    assert kept.refresh() == 3
    acc = accumulate(out)
    marker = acc.Scalars("tiny/flags")
    assert [(e.step, round(e.value, 4)) for e in marker] == [(5, round(5.0 - 0.5, 4))]  # at the loss there
    texts = [e for e in acc.Tensors("flags/text_summary")]
    assert len(texts) == 1 and b"**stalled** at step 5: loss flat for 3 windows" in texts[0].tensor_proto.string_val[0]
    # the outcome changed: a new session run, the old one gone
    assert [p.name for p in out.iterdir() if p.is_dir()] == ["stalled"]
    (events,) = (out / "stalled").glob(f"*{SUFFIX}")
    starts = [v for e in EventFileLoader(str(events)).Load() for v in e.summary.value
              if v.tag == "_hparams_/session_start_info"]
    data = plugin_data_pb2.HParamsPluginData.FromString(starts[0].metadata.plugin_data.content)
    assert data.session_start_info.hparams["status"].string_value == "stalled"
    assert data.session_start_info.hparams["flags"].string_value == "stalled"
    assert steps(accumulate(logdir / "tiny" / "standard" / "seed0"), "tiny/train_loss") == [1, 2]
    assert steps(accumulate(logdir / "rr-60m" / "review" / "seed0"), "rr-60m/train_loss") == [1]
    # the sweep pseudo-run: the layout now has the new size, the table every run and its state
    sweep_acc = accumulate(logdir / "_sweep")
    table = sweep_acc.Tensors("sweep/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "| tiny/review/seed0 | stalled | 5 |" in table and "tiny/standard/seed0" in table
    assert "stalled (loss flat for 3 windows)" in table
    layouts = sweep_acc.Tensors("custom_scalars__config__")
    assert len(layouts) == 2 and b"size rr-60m" in layouts[-1].tensor_proto.string_val[0]
    assert kept.refresh() == 0  # and then nothing more


def test_a_replaced_metrics_file_is_read_again(tmp_path):
    sweep = tmp_path / "sweep"
    run = sweep / "tiny-review-s0"
    make_run(run, "tiny", "review", range(1, 7))
    logdir, kept = start(sweep)
    # a resume from the step-3 checkpoint cuts metrics.jsonl back (atomic replace), then logs on
    atomic_write_text(run / "metrics.jsonl", lines(range(1, 4)).decode())
    kept.refresh()
    add(run, range(4, 9))
    kept.refresh()
    acc = accumulate(logdir / "tiny" / "review" / "seed0")
    assert steps(acc, "tiny/train_loss") == list(range(1, 9))  # TensorBoard purged the cut steps, each once


def test_the_sweep_tab_is_the_status_table_refreshed(tmp_path, monkeypatch):
    """`rrtrain dashboard` on a sweep written by `rrtrain sweep` (a sweep.json): the `_sweep` text is the `rrtrain
    status` table (the same text, as a markdown code block), asked again at every refresh through one
    StatusCache (a refresh reads only the new bytes), and the dashboard cancels nothing."""
    from launchers import cancel
    from launchers.sweep import record
    from launchers.state import status as status_cli
    from rrtrain.cli import sweep as sweep_cli
    from rrtrain.cli.dashboard import StatusSummary
    from rrtrain.cli.main import COMMANDS

    assert COMMANDS["dashboard"][0] == "rrtrain.cli.dashboard"  # what `rrtrain dashboard` runs
    sweep = tmp_path / "sweep"
    entries = {}
    for variant in ("review", "standard"):
        rid = f"tiny-{variant}-s0"
        make_run(sweep / rid, "tiny", variant, range(1, 4))
        entries[rid] = {"size": "tiny", "variant": variant, "seed": 0, "dir": str(sweep / rid), "resources": {},
                        "config": {"model": {"size": "tiny", "variant": variant}, "data": {"path": None},
                                   "train": {"seed": 0, "max_steps": 10, "tokens": None, "global_batch": 8},
                                   "run": {"dir": str(sweep / rid)}}}
    write_record(sweep, {"version": 1, "name": "tab", "runs": entries, "submissions": [], "cancel_flagged": True})
    cancels = []
    monkeypatch.setattr(cancel, "cancel_flagged", lambda *a, **k: cancels.append(a) or [])

    def shown() -> list[str]:
        acc = accumulate(logdir / "_sweep")
        return [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("sweep/text_summary")]

    def status() -> str:
        return "\n".join("    " + line for line in status_cli.table(status_cli.collect(sweep)).splitlines())

    summary = StatusSummary(sweep)
    state: list[LiveLogdir] = []
    logdir, _ = build_logdir(sweep, state, summary)
    kept = state[0]
    first = shown()
    assert first == [status()]
    assert "sched" in first[0] and "tok/s" in first[0] and "3/10" in first[0]  # status's columns: step / total
    advancing = sweep / "tiny-review-s0" / "metrics.jsonl"
    read = {p: t.bytes_read for p, t in summary.cache.tails.items()}
    add(sweep / "tiny-review-s0", range(4, 6))
    assert kept.refresh() == 1
    now = shown()
    assert len(now) == 2 and now[-1] == status() and "5/10" in now[-1]
    grown = {p: t.bytes_read - read[p] for p, t in summary.cache.tails.items()}
    assert grown[advancing] == len(lines(range(4, 6))) and sum(grown.values()) == grown[advancing]
    assert kept.refresh() == 0 and len(shown()) == 2  # the same table: nothing appended
    assert cancels == []  # the dashboard only shows, as `rrtrain status` does; `sweep --cancel-flagged` acts
    status_cli.collect(sweep)
    assert cancels == []
    sweep_cli.cancel_command(sweep)
    assert len(cancels) == 1

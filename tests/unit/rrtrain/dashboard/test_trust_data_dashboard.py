"""A loop of symbolic links where the dashboard walks (a run's event file, `.dashboard/logdir`) is one line and the
dashboard goes on: Path.resolve raises RuntimeError on a loop on Python 3.11, not OSError, and the running
dashboard's refresh loop caught only OSError. Budget: about 5 s."""

from __future__ import annotations

from pathlib import Path

from rrtrain.dashboard.tensorboard import LiveLogdir, build_logdir
from unit.rrtrain.dashboard.test_dashboard_live import accumulate, add, make_run, steps


def start(sweep: Path) -> tuple[Path, LiveLogdir]:
    state: list[LiveLogdir] = []
    logdir, _ = build_logdir(sweep, state)
    return logdir, state[0]


def test_an_event_file_that_is_a_loop_is_skipped_in_one_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    run = sweep / "tiny-review-s0"
    make_run(run, "tiny", "review", range(1, 4))
    (run / "tb").mkdir()
    loop = run / "tb" / "events.out.tfevents.1.host"
    loop.symlink_to(loop)  # a link to itself
    logdir, kept = start(sweep)
    err = capsys.readouterr().err
    assert err.count("a loop of symbolic links") == 1 and str(loop) in err
    add(run, range(4, 6))
    (run / "tb" / "events.out.tfevents.2.host").write_bytes(b"")  # the refresh after it still links new files
    assert kept.refresh() == 1  # the running dashboard goes on, and says nothing twice
    assert "loop" not in capsys.readouterr().err
    out = logdir / "tiny" / "review" / "seed0"
    assert steps(accumulate(out), "tiny/train_loss") == [1, 2, 3, 4, 5]
    assert (out / "events.out.tfevents.2.host").is_symlink() and not (out / loop.name).exists()


def test_a_logdir_link_that_is_a_loop_is_replaced(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    make_run(sweep / "tiny-review-s0", "tiny", "review", range(1, 3))
    (sweep / ".dashboard").mkdir()
    (sweep / ".dashboard" / "logdir").symlink_to("logdir")
    logdir, kept = start(sweep)
    assert "is a loop of symbolic links; replacing it" in capsys.readouterr().err
    assert logdir.resolve().parent == (sweep / ".dashboard").resolve()
    assert steps(accumulate(logdir / "tiny" / "review" / "seed0"), "tiny/train_loss") == [1, 2]

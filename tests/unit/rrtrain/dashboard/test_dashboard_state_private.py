"""The dashboard's own state (its builds of the logdir, their key, the `logdir` link) is the user's alone and never
in a directory others can write: in a sweep of the user's own, `SWEEP/.dashboard`, everything 0700 / 0600; in a
sweep others can write, a private directory of this invocation (removed at its end), nothing written into the sweep
and nothing read from a `.dashboard` someone planted there (the review: a `.dashboard/logdir` link pointed at the
user's private sweep showed its runs); TensorBoard is given the private build's real path. About 1 CPU-s."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rrtrain.core import files
from rrtrain.dashboard import tensorboard
from rrtrain.dashboard.tensorboard import LiveLogdir, build_logdir
from unit.rrtrain.dashboard.test_dashboard_live import make_run


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def shared_sweep(tmp_path: Path) -> tuple[Path, Path]:
    """A sweep others can write, with a `.dashboard` someone planted (0777, `logdir` a link to the user's private
    sweep); returns (the shared sweep, the private one)."""
    private = tmp_path / "alice" / "sweep1"
    make_run(private / "tiny-secret-s0", "tiny", "secret", range(1, 3))
    sweep = tmp_path / "proj" / "msweep"
    make_run(sweep / "tiny-review-s0", "tiny", "review", range(1, 3))
    sweep.chmod(0o777)
    planted = sweep / ".dashboard"
    planted.mkdir()
    planted.chmod(0o777)
    (planted / "logdir").symlink_to(private, target_is_directory=True)
    return sweep, private


def test_a_shared_sweep_gets_no_state_and_its_planted_state_is_never_used(tmp_path):
    sweep, private = shared_sweep(tmp_path)
    state: list[LiveLogdir] = []
    logdir, names = build_logdir(sweep, state)
    kept = state[0]
    try:
        assert names == ["tiny/review/seed0"]  # the sweep's own run, none of the private sweep's
        home = kept.scratch
        assert home is not None and logdir.parent == home and sweep not in home.parents
        assert sorted(p.name for p in (sweep / ".dashboard").iterdir()) == ["logdir"]  # nothing written there
        assert os.readlink(sweep / ".dashboard" / "logdir") == str(private)
        assert files.private_path_problem(home) is None
        assert mode(home) == 0o700 and mode(kept.build) == 0o700
        assert (logdir / "tiny" / "review" / "seed0").is_dir() and not (logdir / "tiny" / "secret").exists()
    finally:
        files.remove_made_dir(kept.scratch)


def test_a_private_sweep_keeps_its_state_in_it_all_private(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep / "tiny-review-s0", "tiny", "review", range(1, 3))
    state: list[LiveLogdir] = []
    logdir, _ = build_logdir(sweep, state)
    home = sweep / ".dashboard"
    assert logdir == home / "logdir"
    assert mode(home) == 0o700 and mode(state[0].build) == 0o700  # a build was 0755
    assert mode(home / files.KEY_FILE) == 0o600
    assert state[0].scratch is None  # kept: `tensorboard --logdir SWEEP/.dashboard/logdir` works after


def test_tensorboard_reads_the_private_build_and_the_scratch_goes_at_the_end(tmp_path, monkeypatch):
    """`rrtrain dashboard` on a shared sweep, TensorBoard's start stood in for (the command line it gets is the
    claim): `--logdir` is the build's real path in the private directory, which is gone when the command ends."""
    sweep, _ = shared_sweep(tmp_path)
    seen: list[tuple[list[str], LiveLogdir]] = []
    monkeypatch.setattr(tensorboard, "serve", lambda cmd, kept, every: seen.append((cmd, kept)) or 0)
    assert tensorboard.main([str(sweep), "--port", "16125"]) == 0
    (cmd, kept), = seen
    given = cmd[cmd.index("--logdir") + 1]
    assert given == os.path.realpath(kept.build) and kept.scratch is not None
    assert Path(given).parent == Path(os.path.realpath(kept.scratch))
    assert not kept.scratch.exists()


def test_an_event_file_that_is_not_a_regular_file_is_not_handed_to_tensorboard(tmp_path, capsys):
    """A FIFO at an event file's name in someone's run: TensorBoard would open it and wait forever, and show no
    run at all (the review); it is skipped, in one line, and the other runs are shown."""
    sweep = tmp_path / "sweep"
    make_run(sweep / "tiny-review-s0", "tiny", "review", range(1, 3))
    make_run(sweep / "tiny-standard-s0", "tiny", "standard", range(1, 3))
    (sweep / "tiny-review-s0" / "tb").mkdir()
    os.mkfifo(sweep / "tiny-review-s0" / "tb" / "events.out.tfevents.1.host")
    (sweep / "tiny-standard-s0" / "tb").mkdir()
    (sweep / "tiny-standard-s0" / "tb" / "events.out.tfevents.2.host").write_bytes(b"")
    logdir, _ = build_logdir(sweep, [])
    linked = {p.name for p in logdir.rglob("events.out.tfevents.*")}
    assert "events.out.tfevents.2.host" in linked and "events.out.tfevents.1.host" not in linked
    assert "events.out.tfevents.1.host: not a regular file" in capsys.readouterr().err


def test_tensorboard_keeps_its_info_files_in_a_private_temp_dir_removed_at_the_end(tmp_path):
    """TensorBoard writes $TMPDIR/.tensorboard-info/pid-N.info through a link at that name, in a directory it
    makes 0777 without the sticky bit: under a shared /tmp a co-tenant's link there overwrote a file of the
    user's (the review). Its TMPDIR is a private directory of this invocation, gone when it ends."""
    import signal
    import sys

    sweep = tmp_path / "sweep"
    make_run(sweep / "tiny-review-s0", "tiny", "review", range(1, 3))
    state: list[LiveLogdir] = []
    build_logdir(sweep, state)
    seen = tmp_path / "seen"
    child = [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'w').write(os.environ['TMPDIR'])", str(seen)]
    old = signal.getsignal(signal.SIGTERM)
    try:
        assert tensorboard.serve(child, state[0], 0.1) == 0
    finally:
        signal.signal(signal.SIGTERM, old)
    given = Path(seen.read_text())
    assert given.name.startswith("rrtrain-tensorboard-") and not given.exists()

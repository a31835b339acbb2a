"""Every file rrtrain reads back is untrusted: hostile or broken run files, sweep records, manifests, configs and
checkpoint states are skipped or refused in one line naming the file and the field, never a traceback, never
a hang, never a write outside the sweep directory.

The first tests pin the crashes found by hand; the property tests at the end feed arbitrary bytes and arbitrary
JSON values into each reader and into `rrtrain status`, `rrtrain report`, the dashboard's logdir and the
resume path's readers, over a real small sweep directory made once for the module.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launchers.sweep import record
from launchers.state import runstate
from launchers.state import status as status_cli
from rrtrain.cli.main import main as rrtrain_main
from rrtrain.config import load_config
from rrtrain.config_load import read_yaml
from rrtrain.core.command import run_command
from rrtrain.core.errors import UsageError
from rrtrain.dashboard.tensorboard import build_logdir
from rrtrain.data.manifest import read_manifest
from rrtrain.report.collect import find_runs
from rrtrain.rundir import fields, layout, ranks, readers
from rrtrain.rundir import lock as runlock
from rrtrain.rundir import train_state as train_state_file
from rrtrain.rundir.metrics import MetricsLogger
from sweeputil import write_record
from trainutil import REPO

RID = "tiny-review-s0"


# -- the crashes found by hand ----------------------------------------------------------------------------------


def fake_sweep(root: Path, final: Any = None, metrics: bytes | None = None, entry: Any = None) -> Path:
    """A sweep directory of one run, written by hand (the property tests below use a real one)."""
    run = root / RID
    run.mkdir(parents=True)
    if final is not None:
        (run / layout.FINAL).write_text(json.dumps(final))
    (run / layout.METRICS).write_bytes(metrics if metrics is not None else
                                       b'{"step": 1, "loss": 5.0, "tokens": 64}\n{"step": 1, "val_loss": 5.1}\n')
    config = {"train": {"max_steps": 4, "global_batch": 8}, "model": {"size": "tiny"}, "data": {"path": None}}
    if entry is None:
        entry = {"size": "tiny", "variant": "review", "seed": 0, "dir": str(run), "config": config, "resources": {}}
    write_record(root, {"version": 1, "name": "s", "runs": {RID: entry}, "submissions": []})
    return root


def run_cli(*argv: str) -> tuple[int, str]:
    """`rrtrain ARGV` in this process: (exit status, stdout + stderr)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = rrtrain_main([str(a) for a in argv])
    return code, buf.getvalue()


def dashboard(sweep: Path) -> tuple[int, str]:
    """The dashboard's command up to TensorBoard (it builds the logdir, then execs TensorBoard)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = run_command("rrtrain dashboard", lambda argv: build_logdir(argv[0]) and 0, [str(sweep)])
    return code, buf.getvalue()


def test_enormous_numbers_are_not_numbers_and_never_overflow():
    assert fields.integer(10**30) is None and fields.integer("9" * 5000) is None and fields.integer(1e300) is None
    assert fields.integer("²") is None  # str.isdigit admits it; int() does not
    assert fields.number(10**400) is None and fields.finite(10**400) is None
    assert fields.text(10**5000) is None and "int" in fields.short(10**5000)
    assert fields.loss(1e308) is None and fields.loss(-1.0) is None and fields.loss(2.5) == 2.5
    assert fields.count(-3) is None and fields.count(3.0) == 3


def test_status_report_and_dashboard_take_enormous_numbers(tmp_path):
    final = {"status": "completed", "step": 10**400, "tokens": 1e308, "final_val_loss": 1e308, "params": 1e308,
             "size": "tiny", "variant": "review", "seed": 0, "wall_s": -1, "exit_code": "9" * 5000}
    metrics = (b'"a string"\n{"step": 99999999999999999999999999, "loss": 2}\n{"step": 3.5, "loss": 2}\n'
               b'{"kind": ["a list"], "step": 2, "loss": 1.0}\n'
               b'{"step": 1, "loss": 1e400, "tokens_per_s": 1e400}\n{"step": 2, "loss": 1e308, "val_loss": -5}\n')
    sweep = fake_sweep(tmp_path / "s", final, metrics)
    code, out = run_cli("status", sweep, "--json")
    assert code == 0, out
    row = json.loads(out)["runs"][0]  # still JSON: no Infinity
    assert row["state"] == "completed" and row["step"] == 2 and row["tokens_per_s"] is None and row["loss"] == 1e308
    code, out = run_cli("report", sweep)
    assert code in (0, 2) and "Traceback" not in out, out
    code, out = dashboard(sweep)
    assert code == 0 and "Traceback" not in out, out


def test_a_final_json_of_the_wrong_shape_costs_only_its_fields(tmp_path):
    final = readers.parse_final({"status": "completed", "flags": "stalled", "flag_details": [1], "params": 1e300,
                                 "final_val_loss": 1e300, "step": 10**30})
    assert (final.flags, final.flag_details, final.params, final.final_val_loss, final.step) == ((), {}, None, None, None)
    named = " | ".join(final.problems)
    for key in ("'flags'", "'flag_details'", "'params'", "'final_val_loss'", "'step'"):
        assert key in named


@pytest.mark.parametrize("runs, why", [
    ({"bad": {}}, "runs.'bad'.dir: not a path"),
    ({"bad": 1}, "runs.'bad': not an object (a int)"),
    ([1], "runs: not an object (a list)"),
    ({"../x": {"dir": "/tmp"}}, "the run id is not a plain name"),
    ({"bad": {"dir": "/etc", "size": "tiny", "variant": "v", "seed": 0, "config": {}}}, "is outside the sweep directory"),
    ({"bad": {"dir": "DIR", "size": "tiny", "variant": "v", "seed": 1.5, "config": {}}}, "runs.'bad'.seed: not an integer"),
    ({"bad": {"dir": "DIR", "size": "tiny", "variant": "v", "seed": 1, "config": []}}, "runs.'bad'.config: not an object"),
])
def test_status_skips_a_sweep_json_run_entry_it_cannot_use_with_one_line(tmp_path, runs, why):
    good = fake_sweep(tmp_path / "s")
    rec = json.loads((good / "sweep.json").read_text())
    runs = json.loads(json.dumps(runs).replace('"DIR"', json.dumps(str(good / "bad"))))
    rec["runs"] = {**rec["runs"], **runs} if isinstance(runs, dict) else runs
    rec["submissions"] = [1, {"jobs": [1]}, {"executor": "local", "jobs": {RID: "local:1"}}]
    (good / "sweep.json").write_text(json.dumps(rec))
    code, out = run_cli("status", good, "--json")
    assert code == 0, out
    warnings = [line for line in out.splitlines() if line.startswith("rrtrain status: warning: sweep.json: ")]
    assert any(why in line for line in warnings), out
    assert any("submissions[0]: not an object" in line for line in warnings)
    status = json.loads(out.splitlines()[-1])
    assert status["problems"] and [r["id"] for r in status["runs"]] == ([RID] if isinstance(runs, dict) else [])


def test_rrtrain_sweep_refuses_a_sweep_json_it_cannot_use(tmp_path):
    sweep = fake_sweep(tmp_path / "s", entry={"dir": 5})
    with pytest.raises(UsageError, match=r"sweep.json: runs.'tiny-review-s0'.dir: not a path .*repair or move"):
        record.load(sweep)


def test_a_code_snapshot_outside_the_sweep_is_never_recorded_as_ours(tmp_path):
    sweep = fake_sweep(tmp_path / "s")
    rec = json.loads((sweep / "sweep.json").read_text())
    rec["code"] = {"path": str(tmp_path / "elsewhere"), "sha256": "x"}
    (sweep / "sweep.json").write_text(json.dumps(rec))
    problems: list[str] = []
    assert record.load(sweep, problems).code is None
    assert "code.path" in problems[0] and "outside the sweep directory" in problems[0]


def test_total_steps_of_a_recorded_config_missing_sections():
    assert runstate.total_steps({}) is None
    assert runstate.total_steps({"train": [], "model": 1}) is None
    assert runstate.total_steps({"train": {"tokens": 6400, "global_batch": 8}, "model": {"size": ["x"]}}) is None
    assert runstate.total_steps({"train": {"max_steps": "4"}}) == 4


@pytest.mark.parametrize("name, value", [("size", "../../../escaped"), ("variant", "/abs/escaped"),
                                         ("seed", "../../escaped"), ("size", "..")])
def test_the_dashboard_never_writes_outside_the_sweep(tmp_path, name, value):
    sandbox = tmp_path / "sandbox"
    final = {"status": "completed", "size": "tiny", "variant": "review", "seed": 0, "final_val_loss": 1.0}
    sweep = fake_sweep(sandbox / "s", {**final, name: value})
    good = fake_sweep(sandbox / "s" / "nested", final)
    code, out = dashboard(sweep)
    assert code == 0, out
    assert f"skipping {sweep / RID}: its {name}" in out and "is not a plain name" in out
    assert sorted(os.listdir(sandbox)) == ["s"] and not Path("/abs").exists()
    assert (sweep / ".dashboard" / "logdir" / "tiny" / "review" / "seed0").is_dir()  # the good run is shown
    assert good.is_dir()


def test_the_dashboard_refuses_a_planted_dashboard_link(tmp_path):
    sweep = fake_sweep(tmp_path / "s", {"status": "completed", "size": "tiny", "variant": "review", "seed": 0})
    (tmp_path / "elsewhere").mkdir()
    (sweep / ".dashboard").symlink_to(tmp_path / "elsewhere")
    code, out = dashboard(sweep)
    assert code == 2 and "is not a directory of its own" in out
    assert os.listdir(tmp_path / "elsewhere") == []


def test_rank_files_of_the_wrong_types_are_left_out_or_typed(tmp_path):
    d = tmp_path / "run" / layout.RANKS
    d.mkdir(parents=True)
    (d / "rank0.json").write_text(json.dumps({"rank": 0, "host": 7, "world_size": 2, "started": 10**400}))
    (d / "rank1.json").write_text(json.dumps({"rank": 10**30, "host": "b"}))
    (d / "rank2.json").write_bytes(b"\xff" + b"[" * 100000)
    assert ranks.nodes(tmp_path / "run") == ["7"]  # text, so that the status table can join it


def test_a_fifo_or_a_device_never_hangs_a_reader(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / layout.FINAL)
    os.mkfifo(run / layout.METRICS)
    (run / layout.CONFIG).symlink_to("/dev/zero")
    problems: list[str] = []
    assert readers.read_final(run, problems) is None and "not a regular file" in problems[0]
    assert readers.read_config(run, problems) == {} and "not a regular file" in problems[1]
    assert list(readers.records(run / layout.METRICS)) == [] and readers.latest_records(run / layout.METRICS).train is None


@pytest.mark.parametrize("body, why", [
    (b"\xff\xfe: 1\n", "not UTF-8 text"),
    (b"base: self.yaml\n", "leads back to itself (self.yaml -> self.yaml)"),
    (b"base: [1]\n", "base: expected a file name, got list"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
])
def test_a_config_file_that_cannot_be_read_is_one_line(tmp_path, body, why):
    (tmp_path / "self.yaml").write_bytes(body)
    with pytest.raises(UsageError, match=why.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        read_yaml(tmp_path / "self.yaml")


def test_a_base_cycle_through_two_files_is_named(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nx: 1\n")
    with pytest.raises(UsageError, match=r"leads back to itself \(a.yaml -> b.yaml -> a.yaml\)"):
        read_yaml(tmp_path / "a.yaml")


def test_bad_config_yaml_through_rrtrain_train_is_one_line(tmp_path, capsys):
    """`rrtrain train` in this process (the command's main: an exception it let out would fail the test)."""
    (tmp_path / "c.yaml").write_bytes(b"base: c.yaml\n")
    assert rrtrain_main(["train", str(tmp_path / "c.yaml")]) == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [f"rrtrain train: error: {tmp_path / 'c.yaml'}: base: 'c.yaml' leads "
                                        "back to itself (c.yaml -> c.yaml)"]


@pytest.mark.parametrize("change, why", [
    ({"vocab_size": 10**400}, "'vocab_size' is not a vocabulary size"),
    ({"eos_id": 10**6}, "'eos_id' is not a token id"),
    ({"seq_len": -1}, "'seq_len' is not a sequence length"),
    ({"dtype": "object"}, "'dtype' is not one of"),
    ({"unigram_entropy": float("nan")}, "'unigram_entropy' is not a finite entropy"),
    ({"splits": {"train": {"samples": "x"}}}, "'splits.train.samples' is not a count"),
])
def test_a_manifest_field_of_the_wrong_type_or_range_is_refused(stories_data, tmp_path, change, why):
    manifest = {**json.loads((stories_data / "manifest.json").read_text()), **change}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match=why):
        read_manifest(str(tmp_path))


def test_prep_and_report_out_through_a_file_is_one_line(tmp_path, capsys):
    """The commands in this process (their main: an exception either let out would fail the test)."""
    (tmp_path / "f").write_text("x")
    sweep = fake_sweep(tmp_path / "s", {"status": "completed", "size": "tiny", "variant": "review", "seed": 0,
                                        "final_val_loss": 1.0})
    for cmd in (["prep", "--source", "synthetic:stories", "--tokenizer", "byte", "--seq-len", "16", "--num-docs", "5",
                 "--out", str(tmp_path / "f" / "d")], ["report", str(sweep), "--out", str(tmp_path / "f" / "r")]):
        code = rrtrain_main(cmd)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_prep_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys):
    disk = tmp_path / "small"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:  # `rrtrain prep` in this process (its main: an exception it let out would fail the test)
        code = rrtrain_main(["prep", "--source", "synthetic:stories", "--tokenizer", "byte", "--seq-len", "64",
                             "--num-docs", "3000", "--out", str(disk / "data")])
        err = capsys.readouterr().err
        assert code == 1, err[-2000:]
        assert "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith(
            "rrtrain prep: error: cannot write the dataset: No space left on device")
        assert os.listdir(disk) == []  # the staging directory is gone, and no half-written OUT
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_train_state_of_the_wrong_types_is_refused_naming_the_field(tmp_path):
    good = {"step": 4, "tokens": 256, "skipped": 0, "wall_s": 1.0, "best_val_loss": float("inf"),
            "last_val_loss": None, "loader": {"samples_consumed": 32}, "config": {}, "world_size": 1}
    assert train_state_file.check(dict(good))["step"] == 4
    for change, field in (({"step": "4"}, "'step'"), ({"world_size": 0}, "'world_size'"),
                          ({"loader": {"samples_consumed": -1}}, "'loader.samples_consumed'"),
                          ({"config": [1]}, "'config'"), ({"best_val_loss": None}, "'best_val_loss'"),
                          ({"callbacks": [1]}, "'callbacks'"), ({"x": {"y": 10**30}}, "x.y is an integer beyond")):
        with pytest.raises(train_state_file.BadTrainState, match=field):
            train_state_file.check({**good, **change})
    (tmp_path / "train_state.json").write_bytes(b"[" * 100000)
    with pytest.raises(train_state_file.BadTrainState, match="nested too deeply"):
        train_state_file.read(tmp_path / "train_state.json")
    with pytest.raises(train_state_file.BadTrainState, match="not a JSON object"):
        train_state_file.check([good])


def test_resume_cuts_a_metrics_file_with_lines_that_are_not_utf8(tmp_path):
    path = tmp_path / layout.METRICS
    path.write_bytes(b'{"step": 1, "loss": 5.0}\n\xff\xfe garbage\n"a string"\n{"step": 2, "loss": 4.0}\n'
                     b'{"step": 3, "loss": 3.0}\n')
    MetricsLogger(tmp_path, enabled=True, resume_step=2).close()
    assert path.read_bytes() == b'{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n'


# -- properties: arbitrary content in every file, over a real sweep directory ----------------------------------

NASTY_TEXT = ["../../../escaped", "/abs/escaped", "..", ".", "", "a\nb", "\x00", "x" * 300, "tiny", "review",
              "@SANDBOX@/escaped"]
RAW_NUMBERS = ["9" * 5000, "1e400", "-1e400", "NaN", "Infinity", "-0", "1e-400", "99999999999999999999"]

#: values that have crashed a reader or escaped a directory before: drawn as often as all the random ones
SPECIAL = [10**30, -(10**30), 1e308, -1e308, -1.0, 3.5, True, float("nan"), float("inf"), *NASTY_TEXT]
json_leaf = (st.sampled_from(SPECIAL) | st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
             | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8) | st.sampled_from(["step", "loss", "dir"]), inner,
                                            max_size=4), max_leaves=12)


def dump(value: Any) -> str:
    return json.dumps(value)


def raw_json() -> st.SearchStrategy[bytes]:
    """Text that is JSON but may hold what json.dumps never writes (a 5000-digit integer, 1e400)."""
    return st.sampled_from(RAW_NUMBERS).map(lambda n: f'{{"step": {n}, "loss": {n}, "val_loss": {n}}}'.encode())


def content(base: Any) -> st.SearchStrategy[bytes]:
    """Bytes for a JSON file: random bytes, any JSON value, the real object with one field replaced (or
    dropped), or numbers json.dumps never writes."""
    strategies = [st.binary(max_size=200), json_value.map(lambda v: dump(v).encode()), raw_json()]
    if isinstance(base, dict) and base:
        keys = sorted(base)
        for values in (st.sampled_from(SPECIAL), json_value):  # one field replaced
            strategies.append(st.tuples(st.sampled_from(keys), values).map(
                lambda kv: dump({**base, kv[0]: kv[1]}).encode()))
        strategies.append(st.sampled_from(keys).map(lambda k: dump({x: v for x, v in base.items() if x != k}).encode()))
    return st.one_of(*strategies)


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory, stories_data) -> Path:
    """A real sweep of one tiny run (two steps), trained once for the module, in this process (the debug
    executor): only the files it leaves are under test, and the fast tier trains nothing in a subprocess."""
    root = tmp_path_factory.mktemp("real-sweep")
    spec = root / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "s", "config": "tiny.yaml", "data": str(stories_data), "variants": ["review"],
        "sizes": {"tiny": {"seeds": 1, "overrides": {"train.max_steps": 2}}},
        "overrides": {"train.global_batch": 8, "train.micro_batch": 8, "train.log_every": 1, "train.eval_every": 2,
                      "data.eval_batches": 1, "model.n_layers": 1, "train.diag_every": 1},
        "resources": {"time_min": 10, "signal_delay_s": 30}}))
    out = root / "sweep"
    from rrtrain.cli import sweep as sweep_cli

    assert sweep_cli.main([str(spec), "--out", str(out), "--executor", "debug"]) == 0
    ranks_dir = out / RID / layout.RANKS  # a one-process run writes none: give the readers one to read
    ranks_dir.mkdir()
    (ranks_dir / "rank0.json").write_text(json.dumps({"rank": 0, "host": "a", "world_size": 1, "started": 1.0}))
    return out


@contextlib.contextmanager
def sandboxed(real: Path):
    """A copy of the real sweep (its checkpoints left out) inside an otherwise empty sandbox, with sweep.json
    pointing at the copy; on leaving, the sandbox must hold nothing but the copy."""
    sandbox = Path(tempfile.mkdtemp(prefix="untrusted-"))
    work = sandbox / "sweep"
    shutil.copytree(real, work, ignore=shutil.ignore_patterns(layout.CHECKPOINTS, "code", "slurm", "configs"))
    rec = json.loads((work / "sweep.json").read_text())
    rec["runs"][RID]["dir"] = str(work / RID)
    rec.pop("code", None)
    (work / "sweep.json").write_text(json.dumps(rec))
    try:
        yield work
        assert sorted(os.listdir(sandbox)) == ["sweep"], f"written outside the sweep: {os.listdir(sandbox)}"
        assert not Path("/abs").exists()
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)


FILES = {  # a file the commands read -> what it holds in a real sweep (the base of the one-field changes)
    "final": f"{RID}/{layout.FINAL}", "metrics": f"{RID}/{layout.METRICS}", "config": f"{RID}/{layout.CONFIG}",
    "sweep": "sweep.json", "ranks": f"{RID}/{layout.RANKS}/rank0.json", "cancelled": f"{RID}/{layout.CANCELLED}",
    "lock": f"{RID}/{layout.LOCK}",
}
#: a run.lock as a live holder writes it (this test's own pid: nothing here signals, `status` only reads it)
LOCK_BASE = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": "1", "cmdline": ["python", "-m", "rrtrain"],
             "job": None, "flock": True, "started": 1.0}


def file_content(real: Path, which: str) -> st.SearchStrategy[bytes]:
    path = real / FILES[which]
    if which == "metrics":
        lines = path.read_bytes().splitlines()
        line = st.one_of(content(json.loads(lines[0])), content(json.loads(lines[-1])), raw_json())
        return st.lists(line, min_size=1, max_size=4).map(lambda extra: b"\n".join(lines + extra) + b"\n")
    if which == "config":
        cfg = yaml.safe_load(path.read_text())
        return st.one_of(st.binary(max_size=200), json_value.map(lambda v: yaml.safe_dump(v).encode()),
                         st.tuples(st.sampled_from(sorted(cfg)), json_value).map(
                             lambda kv: yaml.safe_dump({**cfg, kv[0]: kv[1]}).encode()))
    if which == "sweep":
        rec = json.loads(path.read_text())
        entry = rec["runs"][RID]

        def with_entry(kv: tuple[str, Any]) -> bytes:
            return dump({**rec, "runs": {RID: {**entry, kv[0]: kv[1]}}}).encode()

        return st.one_of(content(rec), st.tuples(st.sampled_from(sorted(entry)), json_value).map(with_entry),
                         json_value.map(lambda v: dump({**rec, "submissions": [{"executor": "local", "jobs": v}]}).encode()))
    if which == "lock":
        return content(LOCK_BASE)
    base = json.loads(path.read_text()) if path.exists() else {"reason": "x", "flags": ["stalled"], "time": 1.0}
    return content(base)


#: the files a run's own readers take (report and dashboard read no sweep.json)
RUN_FILES = ("config", "final", "metrics")


@st.composite
def damage(draw, real: Path, files: tuple[str, ...] = tuple(sorted(FILES))) -> tuple[str, bytes]:
    which = draw(st.sampled_from(files))
    return which, draw(file_content(real, which))


def write(real: Path, work: Path, which: str, body: bytes) -> None:
    """`body` into the copy's file; the real sweep's paths in it become the copy's."""
    body = body.replace(b"@SANDBOX@", str(work.parent).encode()).replace(str(real).encode(), str(work).encode())
    (work / FILES[which]).write_bytes(body)


SETTINGS = dict(deadline=20_000, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                derandomize=True)


def no_traceback(code: int, out: str) -> None:
    assert "Traceback" not in out, out[-3000:]
    assert code in (0, 2), out[-3000:]
    if code == 2:
        errors = [line for line in out.splitlines() if ": error: " in line]
        assert len(errors) == 1, out[-3000:]


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_status_never_crashes_on_any_file(real_sweep, data):
    which, body = data.draw(damage(real_sweep))
    with sandboxed(real_sweep) as work:
        write(real_sweep, work, which, body)
        code, out = run_cli("status", work, "--json")
        no_traceback(code, out)
        if code == 0:
            json.loads([line for line in out.splitlines() if line.startswith("{")][-1])  # --json stays JSON


@settings(max_examples=6, **SETTINGS)
@given(data=st.data())
def test_report_never_crashes_on_any_file(real_sweep, data):
    which, body = data.draw(damage(real_sweep, ("final", "metrics")))  # the numbers it computes and plots
    with sandboxed(real_sweep) as work:
        write(real_sweep, work, which, body)
        no_traceback(*run_cli("report", work))


@settings(max_examples=30, **SETTINGS)
@given(data=st.data())
def test_the_dashboard_logdir_never_crashes_or_escapes(real_sweep, data):
    which, body = data.draw(damage(real_sweep, RUN_FILES))
    with sandboxed(real_sweep) as work:
        write(real_sweep, work, which, body)
        no_traceback(*dashboard(work))


@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_every_reader_takes_any_content(real_sweep, data):
    which, body = data.draw(damage(real_sweep))
    with sandboxed(real_sweep) as work:
        write(real_sweep, work, which, body)
        run = work / RID
        problems: list[str] = []
        readers.read_final(run, problems)
        readers.read_config(run, problems)
        readers.read_cancelled(run)
        readers.latest_records(readers.metrics_path(run))
        readers.read_tail(readers.metrics_path(run), None, only=None)
        ranks.nodes(run)
        info = runlock.read(run)
        if info is not None:
            runlock.holder_alive(info)
            runlock.describe(info)
        assert runlock.signallable_pid(run) is None  # nothing in the sandbox holds the lock's flock
        find_runs(work)
        try:
            record.load(work, problems)
            status_cli.collect(work)
        except UsageError:
            pass
        assert all(isinstance(p, str) and "\n" not in p for p in problems)


@pytest.fixture(scope="module")
def real_train_state(real_sweep) -> dict:
    step = sorted((real_sweep / RID / layout.CHECKPOINTS).glob("step_*"))[-1]
    return json.loads((step / train_state_file.NAME).read_text())


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_the_resume_readers_take_any_content(real_sweep, real_train_state, data, tmp_path_factory):
    """A resume reads train_state.json (then compares its config and world size), the run's config file and
    final.json: each refuses in one line (BadTrainState / UsageError) or reads, nothing else."""
    from rrtrain.training.checkpoint import CheckpointManager, check_resume

    which = data.draw(st.sampled_from(["train_state", "config", "final"]))
    d = Path(tempfile.mkdtemp(prefix="resume-"))
    try:
        if which == "train_state":
            body = data.draw(content(real_train_state))
            (d / train_state_file.NAME).write_bytes(body)
            try:
                state = CheckpointManager.read_train_state(d)
            except (OSError, train_state_file.BadTrainState):
                return
            try:
                check_resume(state["config"], real_train_state["config"], state["world_size"], 1, False)
            except UsageError:
                pass
        elif which == "config":
            body = data.draw(file_content(real_sweep, "config"))
            (d / "c.yaml").write_bytes(body)
            try:
                load_config(d / "c.yaml")
            except UsageError:
                pass
        else:
            (d / layout.FINAL).write_bytes(data.draw(file_content(real_sweep, "final")))
            problems: list[str] = []
            final = readers.read_final(d, problems)
            assert final is None or all(v is None or math.isfinite(v) for v in (final.final_val_loss, final.params))
    finally:
        shutil.rmtree(d, ignore_errors=True)


@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_the_manifest_reader_takes_any_content(stories_data, data):
    """A dataset's manifest.json, replaced by anything: read_manifest returns a checked manifest or refuses in
    one line (UsageError), nothing else."""
    base = json.loads((Path(stories_data) / "manifest.json").read_text())
    d = Path(tempfile.mkdtemp(prefix="manifest-"))
    try:
        (d / "manifest.json").write_bytes(data.draw(content(base)))
        try:
            read_manifest(str(d))
        except UsageError as err:
            assert "\n" not in str(err)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_an_integer_of_thousands_of_digits_in_a_config_is_one_line(tmp_path):
    """Python refuses to convert integers past 4,300 digits: YAML's reader and any message that printed one
    raised ValueError through the command."""
    digits = "9" * 5000
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"base: {REPO / 'configs/train/tiny.yaml'}\ntrain:\n  seed: {digits}\n")
    no_traceback(*run_cli("train", cfg))
    assert run_cli("train", cfg)[0] == 2
    code, out = run_cli("train", REPO / "configs/train/tiny.yaml", f"run.name={digits}", "data.path=/nonexistent")
    no_traceback(code, out)
    assert code == 2

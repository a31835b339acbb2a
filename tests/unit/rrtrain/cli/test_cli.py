"""The command line: `rrtrain NAME`, `rrtrain params` (text and JSON), and bad input as one line on
stderr with exit status 2 and no traceback.

Most cases call `rrtrain.cli.main.main` in this process (what the console script and `python -m rrtrain`
call); a few run the real `python -m rrtrain` in a subprocess to check the whole path, exit status included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rrtrain import residuals
from rrtrain.cli.main import main
from sweeputil import write_record
from trainutil import REPO



def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rrtrain", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def usage_error(capsys, argv: list[str]) -> str:
    """Run in-process; assert exit 2, nothing on stdout, one line on stderr; return that line."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (argv, out, err)
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Bad input: at least eight malformed configurations, exact messages, exit status 2


PARAMS_ERRORS = [
    # unknown key, with a suggestion
    (["--set", "d_modle=64"], "unknown key 'model.d_modle'; did you mean 'model.d_model'? (valid here: size, "),
    # wrong type
    (["--set", "n_heads=abc"], "model.n_heads: expected int or null, got 'abc'"),
    (["--set", "norm_eps=small"], "model.norm_eps: expected a number, got 'small'"),
    # impossible shapes
    (["--set", "d_model=65"], "model.d_model=65 is not divisible by model.n_heads=4"),
    (["--set", "n_layers=0"], "model.n_layers must be at least 1, got 0"),
    (["--set", "init_std=-0.02"], "model.init_std must be positive, got -0.02"),
    (["--set", "pos=rope", "--set", "n_heads=64"], "model.pos=rope needs an even head size, got d_model/n_heads=1"),
    # unknown names, with suggestions
    (["--variants", "review,higway"], "unknown variant 'higway' (did you mean 'highway'?); known: standard,"),
    (["--match", "reviw"], "unknown variant 'reviw' (did you mean 'review'?); known: standard,"),
    # bad literal
    (["--set", "pos=rop"], "model.pos: expected one of 'learned', 'rope', got 'rop' (did you mean 'rope'?)"),
    # override without '='
    (["--set", "d_model"], "override 'model.d_model' is not of the form key.sub=value"),
    # argparse's own errors
    (["--widen", "depth"], "argument --widen: invalid choice: 'depth' (choose from 'mlp', 'model')"),
    (["--variants", ","], "--variants is empty"),
    # matching that cannot succeed
    (["--variants", "review,rezero", "--match", "review", "--tolerance", "0"],
     "cannot match rezero to within 0.00% of 3,488,896 parameters"),
]


@pytest.mark.parametrize("extra,message", PARAMS_ERRORS, ids=[" ".join(e) for e, _ in PARAMS_ERRORS])
def test_params_bad_input(capsys, extra, message):
    argv = ["params"] + (extra if "--size" in extra else ["--size", "tiny"] + extra)
    line = usage_error(capsys, argv)
    assert line.startswith("rrtrain params: error: " + message), line


def test_params_unknown_size(capsys):
    line = usage_error(capsys, ["params", "--size", "rr-59m"])
    assert line.startswith("rrtrain params: error: model.size: unknown preset 'rr-59m' (did you mean 'rr-590m'?)")


def test_params_missing_size(capsys):
    assert usage_error(capsys, ["params"]) == "rrtrain params: error: the following arguments are required: --size"


def test_unknown_command_suggests(capsys):
    assert usage_error(capsys, ["parms"]) == \
        "rrtrain: error: unknown command 'parms' (did you mean 'params'?); see 'rrtrain --help'"


def test_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rrtrain NAME [ARGS...]") and "params" in out
    assert main([]) == 2  # no command: the usage, and the usage exit status


def test_subprocess_bad_override_exit_2_no_traceback():
    proc = run_module("params", "--size", "tiny", "--set", "d_modle=64")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("rrtrain params: error: unknown key 'model.d_modle'; did you mean 'model.d_model'?")


def test_subprocess_unknown_command():
    proc = run_module("trian")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == \
        "rrtrain: error: unknown command 'trian' (did you mean 'train'?); see 'rrtrain --help'"


# ---------------------------------------------------------------------------------------------
# `rrtrain params` output


def test_params_json_rr590m_matched(capsys):
    """The issue's acceptance command: documented schema, counts within 0.5%. In this process (the path through
    `python -m rrtrain params` and its exit status are the subprocess tests' above and the pipe test's below)."""
    assert main(["params", "--size", "rr-590m", "--variants", "review,highway,standard", "--match", "review",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"reference", "variants"} and out["reference"] == "review"
    assert list(out["variants"]) == ["review", "highway", "standard"]
    keys = {"params", "gate_params", "d_model", "d_ff", "n_layers", "n_heads"}
    for name, row in out["variants"].items():
        assert set(row) == keys and all(isinstance(v, int) for v in row.values()), name
        assert row["n_layers"] == 20 and row["d_model"] == 1280 and row["n_heads"] == 20
    counts = [row["params"] for row in out["variants"].values()]
    assert max(counts) - min(counts) <= 0.005 * out["variants"]["review"]["params"]
    assert out["variants"]["review"]["d_ff"] == 5120  # the reference keeps the preset's shape
    assert out["variants"]["standard"]["d_ff"] > out["variants"]["highway"]["d_ff"] > 5120
    assert out["variants"]["standard"]["gate_params"] == 0
    assert out["variants"]["review"]["gate_params"] == 40 * (2 * 1280 * 1280 + 1280 + 2 * 1280)


def test_params_json_without_match(capsys):
    assert main(["params", "--size", "tiny", "--variants", ",".join(residuals.names()), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reference"] is None and list(out["variants"]) == residuals.names()
    # tied embedding + positions + 4 blocks of (4*64*64 + 2*64*256) + 8 pre-norms + final norm
    assert out["variants"]["standard"]["params"] == 50257 * 64 + 128 * 64 + 4 * (4 * 64 * 64 + 2 * 64 * 256) + 9 * 64


def test_params_table(capsys):
    argv = ["params", "--size", "rr-150m", "--variants", "review,standard", "--set", "residual.gate_rank=128"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "size rr-150m"
    assert out[1].split() == ["variant", "params", "rule", "extra", "extra", "%", "d_model", "d_ff", "blocks", "heads"]
    review = out[2].split()
    assert review[0] == "review" and review[3].endswith("%") and review[4:] == ["768", "3072", "12", "12"]
    # gate overhead = 24 sublayers * (2 norms + 3*768*128 low-rank + bias); printed as a share of the total
    extra = 24 * (2 * 768 + 3 * 768 * 128 + 768)
    assert int(review[2].replace(",", "")) == extra
    assert float(review[3].rstrip("%")) == pytest.approx(100 * extra / int(review[1].replace(",", "")), abs=0.01)


def test_params_widen_model(capsys):
    assert main(["params", "--size", "rr-590m", "--variants", "review,standard", "--match", "review",
                 "--widen", "model", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["variants"]
    assert out["standard"]["d_model"] > out["review"]["d_model"]
    assert out["standard"]["d_model"] // out["standard"]["n_heads"] == 64
    assert abs(out["standard"]["params"] - out["review"]["params"]) <= 0.005 * out["review"]["params"]


@pytest.mark.parametrize("command", ["train", "bench"])
def test_unknown_variant_stops_train_and_bench_before_any_work(capsys, tmp_path, command):
    """The registry's checks run where the config is loaded (rrtrain.resolve), before a run directory or a model."""
    run = tmp_path / "run"
    line = usage_error(capsys, [command, str(REPO / "configs" / "train" / "tiny.yaml"), "model.variant=reviw",
                                f"run.dir={run}"])
    assert line == (f"rrtrain {command}: error: model.variant: unknown residual rule 'reviw' (did you mean 'review'?); "
                    f"known: {', '.join(residuals.names())}")
    assert not run.exists()


# every subcommand that parses flags does it with rrtrain.core.args.CommandParser: argparse's own errors are one line too
FLAG_COMMANDS = {"prep": ["--source", "synthetic:stories", "--out", "x"], "params": ["--size", "tiny"], "bench": [],
                 "plan": [], "report": ["sweep"], "demo": [], "sweep": ["sweep.yaml"], "status": ["sweep"],
                 "dashboard": ["sweep"]}


@pytest.mark.parametrize("command", sorted(FLAG_COMMANDS))
def test_an_unknown_flag_is_one_line_and_exit_2(capsys, command):
    line = usage_error(capsys, [command, *FLAG_COMMANDS[command], "--no-such-flag"])
    assert line == f"rrtrain {command}: error: unrecognized arguments: --no-such-flag"


@pytest.mark.parametrize("command", ["status", "params"])
def test_output_into_a_pipe_whose_reader_has_gone_ends_quietly(tmp_path, command):
    """`rrtrain status | head`, `rrtrain params | head -1`: once the reader has gone, no traceback and no
    "Exception ignored" at exit, and the exit status of a tool killed by SIGPIPE (141). `status` flushes each
    table as it prints it; `params` leaves its table to the flush at the end."""
    run_dir = tmp_path / "r"
    entry = {"size": "tiny", "variant": "review", "seed": 0, "dir": str(run_dir), "resources": {},
             "config": {"train": {"max_steps": 10, "tokens": None, "global_batch": 8},
                        "model": {"size": "tiny", "seq_len": None}, "data": {"path": None},
                        "run": {"dir": str(run_dir)}}}
    write_record(tmp_path, {"version": 1, "name": "s", "runs": {"r": entry}, "submissions": []})
    args = [str(tmp_path)] if command == "status" else ["--size", "tiny"]
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as in a user's shell
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes anything: every write fails
    try:
        proc = subprocess.run([sys.executable, "-m", "rrtrain", command, *args], cwd=REPO, env=buffered,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_a_broken_pipe_that_is_not_stdout_is_a_real_failure():
    """Only stdout's gone reader ends quietly: a broken pipe to a child or a socket keeps its traceback."""
    from rrtrain.core.command import run_command

    def entry(argv: list[str]) -> int:
        raise BrokenPipeError(32, "Broken pipe (a child's stdin)")

    with pytest.raises(BrokenPipeError, match="a child's stdin"):
        run_command("rrtrain x", entry, [])


@pytest.mark.slow
def test_train_print_config_prints_the_resolved_yaml_and_runs_nothing(capsys, tmp_path, stories_data):
    """`rrtrain train CONFIG ... --print-config`: defaults, overrides and the rule's knobs, checked against the
    dataset where data.path holds one; no run directory is made. A dataset it does not fit is the run's error."""
    import yaml

    run = tmp_path / "run"
    argv = ["train", str(REPO / "configs" / "train" / "tiny.yaml"), "train.lr=0.01", "--print-config",
            f"run.dir={run}", f"data.path={stories_data}"]
    assert main(argv) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["train"]["lr"] == 0.01 and cfg["model"]["variant"] == "review" and cfg["run"]["dir"] == str(run)
    assert cfg["train"]["max_steps"] == 200 and isinstance(cfg["model"]["residual"], dict) and cfg["model"]["residual"]
    assert not run.exists()
    line = usage_error(capsys, [*argv, "model.seq_len=32"])  # the dataset was packed at 64
    assert "seq_len" in line and not run.exists()

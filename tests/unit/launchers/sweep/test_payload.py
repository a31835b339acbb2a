"""submitit's payload of a sweep's job is read as data, never unpickled (launchers.sweep.payload): the call
submitit itself dumps, at submission and at a requeue, is accepted; a function pickled by value, an os.system
REDUCE, another run's or another sweep's call, a finished call and malformed bytes are refused, and nothing the
pickle names is imported. And what a job script does once its run ended (launchers.sweep.seal.ending,
`started`, `field`), which the scripts ask instead of reading JSON themselves. All in process, well under a
second each."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest
from submitit.core.utils import DelayedSubmission

from launchers.executors import entry
from launchers.executors.entry import RunJob, submitit_dir
from launchers.sweep import payload, seal
from rrtrain.rundir.outcome import EXIT_CODES

SWEEP, RUN = "/sweeps/s1", "tiny-review-s0"


def submitted(tmp_path: Path, sweep: str = SWEEP, run: str = RUN, countdown: int = 10) -> bytes:
    """The payload submitit writes for a sweep's task: `map_array`'s DelayedSubmission of RunJob, its timeout
    set, dumped by submitit's own `dump` (cloudpickle, the highest protocol)."""
    call = DelayedSubmission(RunJob(sweep), run)
    call.set_timeout(60, countdown)
    call.dump(tmp_path / "p.pkl")
    return (tmp_path / "p.pkl").read_bytes()


def dumped(obj: object) -> bytes:
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf, pickle.HIGHEST_PROTOCOL)
    return buf.getvalue()


class System:
    def __reduce__(self):
        return (os.system, ("touch /nonexistent/pwned",))


def test_the_call_submitit_dumps_and_its_requeue_are_accepted(tmp_path):
    assert payload.problem(submitted(tmp_path), SWEEP, RUN) is None
    again = RunJob(SWEEP).checkpoint(RUN)  # what submitit's handler dumps at a requeue (job_environment._checkpoint)
    again.set_timeout(60, 9)
    assert payload.problem(dumped(again), SWEEP, RUN) is None


def test_a_function_pickled_by_value_is_refused(tmp_path):
    call = DelayedSubmission(lambda run_id: os.system("echo pwned"), RUN)
    call.set_timeout(60, 10)
    assert "it names cloudpickle" in payload.problem(dumped(call), SWEEP, RUN)


@pytest.mark.parametrize("where", ["whole", "argument"])
def test_an_os_system_reduce_is_refused(where):
    if where == "whole":
        data = pickle.dumps(System(), protocol=pickle.HIGHEST_PROTOCOL)
    else:  # the real call with a REDUCE hidden among its arguments
        call = DelayedSubmission(RunJob(SWEEP), RUN, extra=System())
        call.set_timeout(60, 10)
        data = dumped(call)
    assert payload.problem(data, SWEEP, RUN) == f"it names {os.system.__module__}.system"


def test_a_call_other_than_the_one_submitted_is_refused(tmp_path):
    assert payload.problem(submitted(tmp_path, run="tiny-standard-s0"), SWEEP, RUN) == \
        "it runs another run than this task's"
    assert payload.problem(submitted(tmp_path, sweep="/sweeps/other"), SWEEP, RUN) == \
        "it calls something other than this sweep's run"
    done = DelayedSubmission(RunJob(SWEEP), RUN)
    done.set_timeout(60, 10)
    done._result, done._done = {"status": "completed"}, True  # a "success" that never trains
    assert payload.problem(dumped(done), SWEEP, RUN) == "it holds a result instead of running the run"
    assert payload.problem(dumped(RunJob(SWEEP)), SWEEP, RUN) == "it is not submitit's call"


def test_nothing_the_pickle_names_is_imported_and_bad_bytes_are_one_reason(tmp_path):
    assert "antigravity" not in sys.modules
    assert payload.problem(b"cantigravity\nfly\n.", SWEEP, RUN) == "it names antigravity.fly"
    assert "antigravity" not in sys.modules
    good = submitted(tmp_path)
    for bad in (b"", b"\x80\x05garbage", good[:-4], b"\x80\x05\x85."):
        assert payload.problem(bad, SWEEP, RUN) == "it is malformed", bad
    # a tuple as a dict key: hashing one nested deep enough would exhaust the C stack, so keys are plain values
    assert payload.problem(b"\x80\x05}N\x85Ns.", SWEEP, RUN) == "it holds a key that is not a plain value"
    assert payload.problem(b"\x80\x05(N\x85\x91.", SWEEP, RUN) == "it holds a key that is not a plain value"
    # memo index 2**31-1: pickle's own unpickler would grow its memo to that size; here it is one entry
    assert payload.problem(b"\x80\x05Nr\xff\xff\xff\x7f.", SWEEP, RUN) == "it is not submitit's call"
    assert "REDUCE" in payload.problem(b"\x80\x05NN\x85R.", SWEEP, RUN)  # a REDUCE of no global at all


def test_a_payload_is_read_from_the_jobs_own_file_only(tmp_path):
    root = submitit_dir(tmp_path)
    (root / "7_1").mkdir(parents=True)
    (root / "7_1" / "7_1_submitted.pkl").write_bytes(submitted(tmp_path))
    env = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "9"}
    assert seal.submitit_problem(str(root), SWEEP, RUN, env) is None
    assert seal.submitit_job_id({"SLURM_JOB_ID": "9"}) == "9"
    assert seal.submitit_job_id({"SLURM_JOB_ID": "../9"}) is None
    (root / "7_1" / "7_1_submitted.pkl").unlink()
    (root / "7_1" / "7_1_submitted.pkl").symlink_to(tmp_path / "p.pkl")  # the same bytes, through a link
    assert seal.submitit_problem(str(root), SWEEP, RUN, env).startswith("submitit's payload for job 7_1 cannot be read")
    os.unlink(root / "7_1" / "7_1_submitted.pkl")
    os.mkfifo(root / "7_1" / "7_1_submitted.pkl")  # never waited on
    with pytest.raises(OSError, match="not a regular file"):
        seal.read_payload(root, "7_1", wait_s=0)
    with pytest.raises(FileNotFoundError):
        seal.read_payload(root, "8_0", wait_s=0)


@pytest.mark.parametrize("files, status, timelimit, restart, expected", [
    ({}, 75, True, 0, "requeue"),
    ({"final.json": {"status": "preempted"}}, 1, True, 0, "requeue"),  # torchrun's exit status hides the 75
    ({"final.json": {"status": "preempted"}}, 1, False, 0, "end"),  # a TERM: scancel, or Slurm's own requeue
    ({"final.json": {"status": "failed"}}, 1, True, 0, "end"),
    ({"cancelled.json": "not json"}, 75, True, 0, "cancelled"),  # exists: cancels, read or not
    ({}, 75, True, 3, "exhausted"),
    ({}, 75, True, 9, "requeue"),  # max_requeues None: submitit counts
    # timelimit None (submitit's handler saw the signal): the run's final.json says which signal stopped it
    ({"final.json": {"status": "preempted", "signal": "SIGUSR2"}}, 75, None, 0, "requeue"),
    ({"final.json": {"status": "preempted", "signal": "SIGTERM"}}, 75, None, 0, "end"),
    ({"final.json": {"status": "preempted", "signal": "SIGUSR2"}, "cancelled.json": "{}"}, 75, None, 0, "cancelled"),
    ({"final.json": {"status": "completed"}}, 0, None, 0, "end"),
])
def test_what_a_job_script_does_once_its_run_ended(tmp_path, files, status, timelimit, restart, expected):
    for name, body in files.items():
        (tmp_path / name).write_text(body if isinstance(body, str) else json.dumps(body))
    counted = None if restart == 9 else 3
    assert seal.ending(str(tmp_path), status, timelimit, restart, max_requeues=counted) == expected
    assert seal.PREEMPTED_EXIT == EXIT_CODES["preempted"]
    if timelimit is None:  # a submitit job asks the same rule (a sweep with no record: its run is SWEEP/RUN_ID)
        assert entry.wants_requeue(tmp_path.parent, tmp_path.name, status) == (expected == "requeue")


def test_started_and_field_read_json_objects_only_through_the_layer_s_rules(tmp_path, capsys):
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank0.json").write_text(json.dumps({"job_id": "5", "restart": 1, "rank": 0}))
    assert seal.started(str(tmp_path), "5", 1) and not seal.started(str(tmp_path), "5", 0)
    os.mkfifo(tmp_path / "ranks" / "rank1.json")  # skipped, never waited on
    assert not seal.started(str(tmp_path), "6", 0)
    (tmp_path / "r.json").write_text(json.dumps({"port": 23456, "id": "x", "flag": True}))
    assert seal.main(["field", str(tmp_path / "r.json"), "port"]) == 0 and capsys.readouterr().out == "23456\n"
    assert seal.main(["field", str(tmp_path / "r.json"), "flag"]) == 1
    assert seal.main(["ended", str(tmp_path), "75", "1", "0", "2"]) == 0 and capsys.readouterr().out == "requeue\n"
    assert seal.main(["ended", "x"]) == 2 and capsys.readouterr().err.startswith("usage: seal.py ended ")


def test_the_job_sides_program_fits_in_one_argument():
    """Scripts run it as `python -I -c "$RRTRAIN_SEAL"`, and the array script exports it: Linux takes at most
    128 KiB in one argument or environment string (MAX_ARG_STRLEN)."""
    text = seal.inline_source()
    assert len(text.encode()) < 128 * 1024
    assert [line for line in text.splitlines() if line.startswith("module = define(")] == \
        [f"module = define({name!r}, r" + "'" * 3 for name in seal.PROGRAM]


def test_a_prep_array_task_runs_only_the_task_submitted(tmp_path, capsys):
    """`rrtrain prep --executor slurm --tasks N`: each task's job script asks `seal.py task` (the lines
    run_array adds) whether submitit's payload is `PrepTask(work)` called with the task's own index."""
    from data_prep.cluster import PrepTask
    from launchers.executors.slurm import task_seal_lines

    work, folder = "/scratch/prep/.work", tmp_path / "logs"
    callee, state = ("data_prep.cluster", "PrepTask"), {"work": work}
    for index in (0, 3):
        (folder / f"7_{index}").mkdir(parents=True)
        call = DelayedSubmission(PrepTask(work), index)
        call.set_timeout(60, 0)
        call.dump(folder / f"7_{index}" / f"7_{index}_submitted.pkl")
    env = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "12"}
    assert seal.array_task_problem(str(folder), callee, state, env) is None
    assert payload.call_problem((folder / "7_0" / "7_0_submitted.pkl").read_bytes(), callee, state, 3) == \
        "it runs another task than this one"
    assert payload.call_problem(dumped(DelayedSubmission(PrepTask("/other"), 3)), callee, state, 3) == \
        "it calls something other than this task"
    assert payload.call_problem(dumped(DelayedSubmission(RunJob(work), 3)), callee, state, 3) == \
        "it names launchers.executors.entry.RunJob"  # a sweep's call where a prep task's is due
    assert payload.call_problem(dumped(DelayedSubmission(PrepTask(work), "3")), callee, state, 3) == \
        "it runs another task than this one"  # "3", not 3
    assert seal.array_task_problem(str(folder), callee, state, {**env, "SLURM_ARRAY_TASK_ID": "x"}) == \
        "no array task index in the environment"
    call = DelayedSubmission(PrepTask(work), 3, extra=System())
    call.set_timeout(60, 0)
    (folder / "7_3" / "7_3_submitted.pkl").write_bytes(dumped(call))
    assert f"it names {os.system.__module__}.system" in seal.array_task_problem(str(folder), callee, state, env)

    # the lines the task's script runs: exit 2 and one line on a payload that is not the call, 0 on the call
    lines = task_seal_lines(sys.executable, PrepTask(work), folder)
    assert lines[-1].endswith("|| exit 2") and f"{json.dumps(state)}" in lines[-1]
    script = "\n".join([*lines, "echo started"])
    proc = subprocess.run(["bash", "-c", script], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "started" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.startswith("rrtrain: refusing to start the array task: submitit's payload for job 7_3")
    good = DelayedSubmission(PrepTask(work), 3)
    good.set_timeout(60, 0)
    good.dump(folder / "7_3" / "7_3_submitted.pkl")
    proc = subprocess.run(["bash", "-c", script], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout == "started\n", proc.stdout + proc.stderr

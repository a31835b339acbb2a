"""What a sweep's job reads from the sweep directory when it starts, bound at submission to what Slurm holds.

A run of a sweep starts long after `rrtrain sweep` submitted it (queued, requeued, the local executor's next
run), and imports the code snapshot and reads its config from the sweep directory as it finds them then. So
`rrtrain sweep` writes their digests where the job cannot be talked out of them: into the text of the script
Slurm keeps (the array script's rows, the multi-node script's variables, the lines submitit's script runs
first), or, for the local executor, into its own memory. Before anything of the snapshot is imported, the job
runs this file with `python -I` (no environment, no user site, not the sweep directory on its path) and checks:

- the snapshot: a directory of this user's, every entry under it this user's, its tree hash (`tree_hash`: every
  entry's name, kind, mode and contents) the one recorded;
- the config: a regular file of this user's whose SHA-256 is the one recorded. The trainer checks the bytes it
  parses against the same digest again (`RRTRAIN_CONFIG_SHA256`), so a config swapped after this check is
  refused too;
- under submitit, its payload (`SWEEP/slurm/submitit/JOB/JOB_submitted.pkl`, written by submitit at submission
  and again at each requeue, unpickled on the node): a regular file of this user's, read as data and never
  unpickled (`launchers.sweep.payload`), that must be exactly the call submitted for this task's run. The array
  tasks of `rrtrain prep --executor slurm` check theirs the same way (`task`).

A mismatch is one line on stderr and exit status 2: nothing of the snapshot runs. After the run, the same
program says what the job script does next (`ending`, `started`, `field`), so the scripts read no JSON
themselves. It is the standard library alone (this file and payload.py), so that a copy of its text
(`inline_source`) can live in a script and run on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

from launchers.sweep import payload

#: the environment variable the trainer reads the config's digest from (rrtrain.config_load.read_yaml)
CONFIG_DIGEST_ENV = "RRTRAIN_CONFIG_SHA256"
#: the largest config a job reads (a sweep's expanded run config is a few kilobytes)
MAX_CONFIG_BYTES = 1 << 20


def entries(root: Path, packages: Optional[Sequence[str]] = None,
            copied_mode: Optional[Callable[[int], int]] = None) -> Iterator[tuple[str, int, bool]]:
    """(relative name, mode, is a file to read) of every entry under `root`, in a fixed order; links are never
    followed. With `packages` (a checkout): those packages as a snapshot of them holds them (byte code left
    out, a link copied as what it points to, the modes `copied_mode` gives); else every entry of a snapshot with
    its own mode, nothing left out."""
    source = packages is not None
    tops = sorted(root / p for p in packages) if source else sorted(root.iterdir())
    for top in tops:
        for path in [top] + sorted(top.rglob("*")):
            rel = str(path.relative_to(root))
            if source and (path.name == "__pycache__" or "__pycache__" in path.parts or path.suffix == ".pyc"):
                continue
            if source:
                st = os.stat(path)
                mode = stat.S_IFMT(st.st_mode) | (copied_mode or (lambda m: m))(st.st_mode)
            else:
                mode = os.lstat(path).st_mode
            yield rel, mode, stat.S_ISREG(mode)


def open_beneath(root: Path, rel: str) -> int:
    """A descriptor of the regular file `root/rel`, no link followed on the way (each directory opened with
    O_NOFOLLOW from the one above); OSError otherwise."""
    parts = Path(rel).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise OSError(f"{root / rel}: not a regular file")
    os.set_blocking(out, True)
    return out


def tree_hash(root: Path, packages: Optional[Sequence[str]] = None,
              copied_mode: Optional[Callable[[int], int]] = None) -> str:
    """SHA-256 of every entry under `root` (`entries`): a file added, removed, renamed, changed or made
    executable, a link or a FIFO in place of a file, all change it."""
    h = hashlib.sha256()
    for rel, mode, readable in entries(root, packages, copied_mode):
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + f"{mode:o}".encode() + b"\0")
        if readable:
            with os.fdopen(open_beneath(root, rel), "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            h.update(b"\0")
        elif stat.S_ISLNK(mode):
            h.update(os.readlink(root / rel).encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()


def config_digest(path: Path) -> str:
    """SHA-256 of the config file at `path`: a regular file (not a link) of this user's, at most
    MAX_CONFIG_BYTES; OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise OSError(f"{path}: not a regular file of yours")
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise OSError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    return hashlib.sha256(data).hexdigest()


def problem(code: Optional[str], code_digest: Optional[str], config: Optional[str],
            config_digest_expected: Optional[str]) -> Optional[str]:
    """Why the snapshot at `code` or the config at `config` is not what was submitted, or None."""
    uid = os.getuid()
    if code is not None:
        root = Path(code)
        try:
            st = os.lstat(root)
            if not stat.S_ISDIR(st.st_mode):
                return f"the code snapshot {root} is not a directory"
            if any(os.lstat(p).st_uid != uid for p in [root, *root.rglob("*")]):
                return f"the code snapshot {root} holds an entry that is not yours"
            if tree_hash(root) != code_digest:
                return f"the code snapshot {root} is not what was submitted (a file was changed, added or removed)"
        except OSError as err:
            return f"the code snapshot {root} cannot be read ({err.strerror or err})"
    if config is not None:
        try:
            if config_digest(Path(config)) != config_digest_expected:
                return f"the run's config {config} is not the one submitted (it was changed since)"
        except OSError as err:
            return f"the run's config {config} cannot be read ({err.strerror or err})"
    return None


#: how long a task waits for its payload: submitit moves an array's payloads into place only after sbatch
#: returns, and its own job waits as long for them
PAYLOAD_WAIT_S = 60.0


def submitit_job_id(env: Mapping[str, str]) -> Optional[str]:
    """The id submitit names a job's files by (submitit's JobEnvironment.job_id): ARRAY_TASK for an array's
    task, else the job id; None when the environment holds no Slurm job id."""
    array_job = env.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{env.get('SLURM_ARRAY_TASK_ID', '')}" if array_job else env.get("SLURM_JOB_ID", "")
    return job if re.fullmatch(r"[0-9]+(_[0-9]+)?", job) else None


def read_payload(submitit_dir: Path, job_id: str, wait_s: float = PAYLOAD_WAIT_S) -> bytes:
    """The bytes of `submitit_dir/JOB/JOB_submitted.pkl`, a regular file of this user's reached through no link
    (`open_beneath`), at most payload.MAX_BYTES, waited for `wait_s`; OSError otherwise."""
    rel, deadline = f"{job_id}/{job_id}_submitted.pkl", time.monotonic() + wait_s
    while True:
        try:
            fd = open_beneath(submitit_dir, rel)
            break
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_uid != os.getuid():
            raise OSError(f"{submitit_dir / rel}: not a file of yours")
        data = fh.read(payload.MAX_BYTES + 1)
    if len(data) > payload.MAX_BYTES:
        raise OSError(f"{submitit_dir / rel}: larger than {payload.MAX_BYTES} bytes")
    return data


def submitit_problem(submitit_dir: str, sweep_dir: str, run_id: str,
                     env: Mapping[str, str] = os.environ) -> Optional[str]:
    """Why this job's submitit payload under `submitit_dir` is not the call submitted for `run_id`, or None."""
    return _payload_problem(submitit_dir, env, lambda data: payload.problem(data, sweep_dir, run_id))


def array_task_problem(submitit_dir: str, callee: tuple[str, str], state: dict,
                       env: Mapping[str, str] = os.environ) -> Optional[str]:
    """Why this array task's submitit payload under `submitit_dir` is not `callee(**state)` called with this task's
    index (`rrtrain prep --executor slurm --tasks N`: launchers.executors.slurm.run_array), or None."""
    index = env.get("SLURM_ARRAY_TASK_ID", "")
    if not re.fullmatch(r"[0-9]{1,9}", index):
        return "no array task index in the environment"
    return _payload_problem(submitit_dir, env, lambda data: payload.call_problem(data, callee, state, int(index)))


def _payload_problem(submitit_dir: str, env: Mapping[str, str],
                     check: Callable[[bytes], Optional[str]]) -> Optional[str]:
    job_id = submitit_job_id(env)
    if job_id is None:
        return "no Slurm job id in the environment to find submitit's payload by"
    try:
        data = read_payload(Path(submitit_dir), job_id)
    except OSError as err:
        return f"submitit's payload for job {job_id} cannot be read ({err.strerror or err})"
    why = check(data)
    return None if why is None else f"submitit's payload for job {job_id} is not the call submitted ({why})"


@dataclass(frozen=True)
class Bound:
    """A submission's digests: the snapshot's tree hash and each run's config's SHA-256, by run id."""

    code_sha256: str
    configs: dict[str, str]


def bind(code: str, configs: dict[str, Path]) -> Bound:
    """The digests of the snapshot at `code` and of `configs` (run id -> path), taken at submission (the sweep
    checked the snapshot against its record a moment before, under its lock)."""
    return Bound(tree_hash(Path(code)), {rid: config_digest(Path(path)) for rid, path in configs.items()})


def refusal(why: str) -> str:
    return f"rrtrain: refusing to start the run: {why}; submit the sweep again (rrtrain sweep)"


def record_refusal(run_dir: Optional[str], why: str) -> None:
    """final.json of a run refused at its start (status `failed`, `why` as its reason), written only where the
    run has none yet: a failure before training never replaces a recorded ending (rrtrain.rundir.outcome).
    Written aside and linked into place (never replacing a file that appeared meanwhile), 0600 in a 0700
    directory; best effort: the one line on stderr is the record where it cannot be written."""
    if run_dir is None:
        return
    final = os.path.join(run_dir, "final.json")
    body = json.dumps({"status": "failed", "reason": f"refused at its start: {why}", "step": 0, "tokens": 0, "flags": [], "details": {}})
    try:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        if os.path.lexists(final):
            return
        tmp = os.path.join(run_dir, f".final.json.refused-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(body + "\n")
            os.link(tmp, final)  # fails, rather than replaces, when final.json appeared meanwhile
        finally:
            os.unlink(tmp)
    except OSError:
        pass


#: a run that stopped at a step boundary to be requeued (rrtrain.rundir.outcome.EXIT_CODES["preempted"])
PREEMPTED_EXIT = 75


def read_object(root: Path, rel: str) -> dict:
    """The JSON object in `root/rel` (`open_beneath`: a regular file, no link below `root`; at most
    MAX_CONFIG_BYTES); {} when it is absent, unreadable or not an object (anyone may have written it)."""
    try:
        with os.fdopen(open_beneath(root, rel), "rb") as fh:
            data = json.loads(fh.read(MAX_CONFIG_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def ending(run_dir: Optional[str], status: int, timelimit: Optional[bool], restart: int,
           max_requeues: Optional[int]) -> str:
    """What a job does once its run ended, the one requeue rule of every job (the sbatch scripts through
    `seal.py ended`, submitit's jobs through launchers.executors.entry): `requeue` a run the time-limit warning
    stopped at a step boundary (exit PREEMPTED_EXIT, or final.json `preempted` where torchrun's exit status hides
    it), unless it was cancelled as flagged (`cancelled`: its cancelled.json exists, read or not) or was requeued
    `max_requeues` times already (`exhausted`; None: the caller counts, as submitit does); `end` for every other
    ending. A TERM is never requeued: it is scancel (the user's stop) or a preemption, which Slurm requeues by
    itself. `timelimit` None: the job's own handler saw the signal (submitit), so the run's final.json says which
    one stopped it."""
    root = Path(run_dir) if run_dir else None
    final = read_object(root, "final.json") if root is not None else {}
    if timelimit is None:
        timelimit = final.get("signal") != "SIGTERM"
    if not timelimit:
        return "end"
    if status != PREEMPTED_EXIT and final.get("status") != "preempted":
        return "end"
    if root is not None and os.path.lexists(root / "cancelled.json"):
        return "cancelled"
    return "exhausted" if max_requeues is not None and restart >= max_requeues else "requeue"


def started(run_dir: str, job_id: str, restart: int) -> bool:
    """Whether a rank of this attempt of the job (`job_id`, `restart`) recorded its host in `run_dir/ranks/`
    (rrtrain.rundir.ranks): the job got as far as training."""
    try:
        names = sorted(n for n in os.listdir(Path(run_dir) / "ranks") if re.fullmatch(r"rank[0-9]+\.json", n))
    except OSError:
        return False
    for name in names[:65536]:
        rec = read_object(Path(run_dir), f"ranks/{name}")
        if rec.get("job_id") == job_id and rec.get("restart") == restart:
            return True
    return False


def _check(argv: Sequence[str]) -> int:
    code, code_sha, config, config_sha, run_dir, *task = (None if a == "-" else a for a in argv)
    why = problem(code, code_sha, config, config_sha)
    if why is None and task:
        submitit_dir, sweep_dir, run_id = task
        why = submitit_problem(str(submitit_dir), str(sweep_dir), str(run_id))
    if why is not None:
        print(refusal(why), file=sys.stderr, flush=True)
        record_refusal(run_dir, why)
        return 2
    return 0


def _ended(argv: Sequence[str]) -> int:
    run_dir, status, timelimit, restart, max_requeues = argv
    print(ending(None if run_dir in ("", "-") else run_dir, int(status), timelimit == "1", int(restart),
                 int(max_requeues)))
    return 0


def _task(argv: Sequence[str]) -> int:
    submitit_dir, module, name, state = argv
    try:
        fields = json.loads(state)
    except ValueError:
        raise ValueError from None  # the usage line
    why = array_task_problem(submitit_dir, (module, name), fields) if isinstance(fields, dict) else "no state"
    if why is not None:
        print(f"rrtrain: refusing to start the array task: {why}", file=sys.stderr, flush=True)
        return 2
    return 0


def _field(argv: Sequence[str]) -> int:
    value = read_object(Path(argv[0]).parent, Path(argv[0]).name).get(argv[1])
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return 1
    print(value)
    return 0


#: how `agentdir`'s refusals end (the multi-node script's words for it)
AGENT_DIR_RULE = ("the torchrun agents' logs go only where no one else can write, on the way to it included: "
                  "set RRTRAIN_AGENT_DIR to a directory of yours")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _chain_problem(absolute: str, uid: int) -> Optional[str]:
    """Why someone other than the user (or root) could change what is at `absolute` (None: no one can): each
    existing component owned by the user or root and writable by no one else, a sticky directory (/tmp) above
    a component of the user's own fine. rrtrain.core.files's private-path rule (OpenSSH's StrictModes), mirrored
    here because this program imports nothing of rrtrain."""
    parts = [p for p in absolute.split(os.sep) if p]
    chain = [os.sep] + [os.sep + os.path.join(*parts[: i + 1]) for i in range(len(parts))]
    for i, place in enumerate(chain):
        try:
            st = os.lstat(place)
        except FileNotFoundError:
            return None  # still to be made
        except OSError as err:
            return f"'{place}' cannot be checked ({err.strerror or type(err).__name__})"
        if st.st_uid not in (uid, 0):
            return f"'{place}' belongs to another user (uid {st.st_uid})"
        if stat.S_ISLNK(st.st_mode):
            continue  # its mode means nothing; where it leads is the resolved path's to check
        if not stat.S_ISDIR(st.st_mode):
            return f"'{place}' is not a directory"
        if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and i + 1 < len(chain)):
            return f"'{place}' can be written by others than you (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def private_dir_problem(path: str) -> Optional[str]:
    """`_chain_problem` of `path` as given and as resolved; the directory itself is never a link."""
    given = os.path.abspath(path)
    if os.path.islink(given):
        return f"'{given}' is a symbolic link"
    for candidate in dict.fromkeys([given, os.path.realpath(given)]):
        why = _chain_problem(candidate, os.geteuid())
        if why is not None:
            return why
    return None


def _open_made(parent: int, name: str, uid: int, where: str, sticky_ok: bool) -> int:
    """A descriptor of the directory `name` in `parent` (made 0700 first when missing), never through a link,
    checked by what was opened to be the user's or root's and writable by no one else (a sticky one above a
    directory of the user's own fine: `sticky_ok`)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass  # made meanwhile: judged below by what is opened
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        st = os.fstat(fd)
        if st.st_uid == uid:
            os.fchmod(fd, 0o700)  # exactly, whatever the umask
    st = os.fstat(fd)
    if st.st_uid not in (uid, 0) or (st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX)):
        os.close(fd)
        raise PermissionError(0, f"'{where}' changed while it was checked")
    return fd


def make_job_dir(agent_dir: str, prefix: str) -> str:
    """A new directory of this job's own (0700, a drawn name after `prefix`) in `agent_dir`: the whole path checked
    (`private_dir_problem`), its missing components made 0700, each directory then opened from the one above with
    no link followed and checked again by what was opened, the job's directory made in the last of them and
    checked once more by its path. ValueError (one line) when someone else could change any of it."""
    why = private_dir_problem(agent_dir)
    if why is not None:
        raise ValueError(why)
    uid = os.geteuid()
    real = os.path.realpath(os.path.abspath(agent_dir))  # the links on the way, judged above, resolved once
    fd = os.open(os.sep, _DIR_FLAGS)
    try:
        names = [p for p in real.split(os.sep) if p]
        for i, name in enumerate(names):
            nxt = _open_made(fd, name, uid, os.sep + os.path.join(*names[: i + 1]), sticky_ok=i + 1 < len(names))
            os.close(fd)
            fd = nxt
        for _ in range(100):
            name = f"{prefix}{secrets.token_hex(5)}"
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
                break
            except FileExistsError:
                continue
        else:
            raise ValueError(f"'{real}': no new name for the job's directory")
        job_fd = _open_made(fd, name, uid, f"{real}/{name}", sticky_ok=False)
    except OSError as err:
        raise ValueError(f"cannot make it ({err.strerror or type(err).__name__})") from None
    finally:
        os.close(fd)
    try:
        os.fchmod(job_fd, 0o700)
        path = os.path.join(os.path.abspath(agent_dir), name)
        why = private_dir_problem(path)
        held, named = os.fstat(job_fd), os.stat(path)
        if why is None and (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            why = f"'{path}' is not the directory just made"
    finally:
        os.close(job_fd)
    if why is not None:
        raise ValueError(why)
    return path


def _agentdir(argv: Sequence[str]) -> int:
    agent_dir, prefix = argv
    if not agent_dir or not re.fullmatch(r"[A-Za-z0-9_.-]*", prefix):
        raise ValueError  # the usage line
    try:
        print(make_job_dir(agent_dir, prefix))
    except ValueError as err:
        print(f"rrtrain multinode: error: {agent_dir} (the torchrun agents' logs): {err}: {AGENT_DIR_RULE}",
              file=sys.stderr, flush=True)
        return 2
    return 0


#: subcommand -> (usage, number of arguments, what runs it)
COMMANDS: dict[str, tuple[str, Sequence[int], Callable[[Sequence[str]], int]]] = {
    "check": ("CODE CODE_SHA256 CONFIG CONFIG_SHA256 RUN_DIR [SUBMITIT_DIR SWEEP_DIR RUN_ID]", (5, 8), _check),
    "ended": ("RUN_DIR STATUS TIMELIMIT(0|1) RESTART MAX_REQUEUES", (5,), _ended),
    "started": ("RUN_DIR JOB_ID RESTART", (3,), lambda a: 0 if started(a[0], a[1], int(a[2])) else 1),
    "field": ("JSON_FILE KEY", (2,), _field),
    "task": ("SUBMITIT_DIR MODULE CLASS STATE_JSON", (4,), _task),
    "agentdir": ("AGENT_DIR PREFIX", (2,), _agentdir),
}


def main(argv: Sequence[str]) -> int:
    """`python -I seal.py check CODE CODE_SHA256 CONFIG CONFIG_SHA256 RUN_DIR [SUBMITIT_DIR SWEEP_DIR RUN_ID]`
    ("-" for a part not checked or not known; `check` may be left out): exit 0 when the snapshot, the config
    and (for submitit's job of RUN_ID) submitit's payload are what was submitted, else one line on stderr, the
    run's final.json saying it (`record_refusal`), and exit 2. `ended` prints what a job script does after its
    run (`ending`); `started` exits 0 when a rank of this attempt recorded itself (`started`); `field` prints an
    integer or text field of a JSON object file (exit 1 when it has none); `task` exits 0 when an array task's
    submitit payload is the call submitted (`array_task_problem`), else one line and exit 2. `agentdir` makes
    the multi-node job's own directory for the torchrun agents' logs in AGENT_DIR and prints its path
    (`make_job_dir`), else one line and exit 2."""
    name = argv[0] if argv and argv[0] in COMMANDS else "check"
    args = argv[1:] if argv and argv[0] == name else argv
    usage, counts, run = COMMANDS[name]
    try:
        if len(args) not in counts:
            raise ValueError
        return run(args)
    except ValueError:
        print(f"usage: seal.py {name} {usage}", file=sys.stderr)
        return 2


#: the modules of the job side's program, in order: each imports the standard library and those before it only
PROGRAM = ("launchers.sweep.payload", "launchers.sweep.seal")


def inline_source() -> str:
    """The job side's program, for a script to run with `python -I -c` (it imports nothing of the sweep directory,
    nor of rrtrain as installed): the text of each module of PROGRAM, defined as that module, then `main`."""
    lines = ["import sys, types", "for name in ('launchers', 'launchers.sweep'):",
             "    sys.modules[name] = types.ModuleType(name)", "def define(name, text):",
             "    module = sys.modules[name] = types.ModuleType(name)",
             "    exec(compile(text, name.replace('.', '/') + '.py', 'exec'), module.__dict__)",
             "    return module"]
    quote = "'" * 3  # each text as a raw string between three single quotes, which neither file holds
    for name in PROGRAM:
        text = (Path(__file__).parent / f"{name.rsplit('.', 1)[1]}.py").read_text(encoding="utf-8")
        if quote in text:
            raise ValueError(f"{name} holds {quote}: it cannot be quoted in the program")
        lines += [f"module = define({name!r}, r{quote}", *text.splitlines(), f"{quote})"]
    return "\n".join([*lines, "sys.exit(module.main(sys.argv[1:]))", ""])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

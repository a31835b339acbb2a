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
  refused too.

A mismatch is one line on stderr and exit status 2: nothing of the snapshot runs. The file is the standard
library alone, so that a copy of its text (`inline_source`) can live in a script and run on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

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


def main(argv: Sequence[str]) -> int:
    """`python -I seal.py CODE CODE_SHA256 CONFIG CONFIG_SHA256 RUN_DIR` ("-" for a part not checked or not
    known): exit 0 when the snapshot and the config are what was submitted, else one line on stderr, the run's
    final.json saying it (`record_refusal`), and exit 2."""
    if len(argv) != 5:
        print("usage: seal.py CODE CODE_SHA256 CONFIG CONFIG_SHA256 RUN_DIR", file=sys.stderr)
        return 2
    code, code_sha, config, config_sha, run_dir = (None if a == "-" else a for a in argv)
    why = problem(code, code_sha, config, config_sha)
    if why is not None:
        print(refusal(why), file=sys.stderr, flush=True)
        record_refusal(run_dir, why)
        return 2
    return 0


def inline_source() -> str:
    """This file's text, for a script to run with `python -I -c` (it imports nothing of the sweep directory)."""
    return Path(__file__).read_text(encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Every shell command that README.md and docs/*.md show as runnable is run here, so the docs cannot drift
from the code.

The convention (docs/README-conventions are in README.md's last section, "Writing docs"):
- A fenced block tagged `bash`, `sh`, `shell` or `console` is runnable; so is an untagged block whose
  commands carry a `$ ` prompt. Untagged blocks without prompts are synopses and examples, not run.
- In `console` blocks and prompted blocks only the `$ ` lines are commands (a trailing `\\` continues one);
  the other lines are output. A `bash`/`sh`/`shell` block runs whole, as one script under `bash -e`.
- HTML comments on the lines right above the fence (blank lines between are allowed) adjust it:
  `<!-- not-run: REASON -->` skips it (say why: a GPU, a real cluster, a long download);
  `<!-- substitute: OLD => NEW -->` replaces the text OLD with NEW in the block before it runs (tiny sizes, fewer
  steps); several may be given, applied in order.
- A file's blocks run in order in one fresh directory that holds links to the repository's `configs/`, `slurm/`,
  `docs/`, `data_prep/`, `launchers/`, `rrtrain/` and `tests/`, so a block may use what an earlier one wrote
  (a `rrtrain prep` before a `rrtrain train`). `rrtrain` and `python` are this test's interpreter's.
A failure names the doc file and the line of the block's fence.

`rrtrain ARGS` and `torchrun ARGS` in a block run as `python -m rrtrain ARGS` and `python -m torch.distributed.run
ARGS`, each a child forked by one fork server (tests/forkserver.py) that imported torch and the command line once
for all the docs, as the tests' training runs are; RRTRAIN_TEST_FORKSERVER=0 runs the installed commands instead.
What a command starts itself (a sweep's runs and its prep, torchrun's ranks) is a new interpreter either way.
Budget: about 100 CPU-seconds for today's docs, most of it the new interpreters just named and the two
`rrtrain plan configs/sweeps/paper.yaml` (reproducing-the-paper.md, scaling.md: about 4 s each).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

import forkserver
import tiers
from trainutil import REPO, env

RUNNABLE_TAGS = ("bash", "sh", "shell", "console")
LINKED = ("configs", "slurm", "docs", "data_prep", "launchers", "rrtrain", "tests")
COMMENT = re.compile(r"^\s*<!--\s*(not-run|substitute)\s*:\s*(.*?)\s*-->\s*$")
BLOCK_TIMEOUT_S = 600


@dataclass
class Block:
    file: str
    line: int  # 1-based line of the opening fence
    script: str  # what bash runs
    skip: Optional[str] = None  # the not-run reason
    substitutions: list[tuple[str, str]] = field(default_factory=list)


def _prompt_commands(body: list[str]) -> list[str]:
    """The `$ ` lines of a console block, continuation lines joined."""
    cmds: list[str] = []
    cont = False
    for line in body:
        if cont:
            cmds[-1] += "\n" + line
        elif line.startswith("$ "):
            cmds.append(line[2:])
        else:
            continue
        cont = line.rstrip().endswith("\\")
    return cmds


def _directives(lines: list[str], fence: int, where: str) -> tuple[Optional[str], list[tuple[str, str]]]:
    """The not-run reason and the substitutions from the comments right above the fence."""
    skip, subs = None, []
    i = fence - 1
    while i >= 0 and (not lines[i].strip() or COMMENT.match(lines[i])):
        m = COMMENT.match(lines[i])
        if m and m.group(1) == "not-run":
            if not m.group(2):
                raise ValueError(f"{where}: `not-run:` needs a reason")
            skip = m.group(2)
        elif m:
            old, sep, new = m.group(2).partition(" => ")
            if not sep or not old:
                raise ValueError(f"{where}: write `<!-- substitute: OLD => NEW -->`, got {m.group(2)!r}")
            subs.insert(0, (old, new))  # read upwards: keep the file's order
        i -= 1
    return skip, subs


def extract(text: str, name: str) -> list[Block]:
    """The runnable blocks of one markdown text, in order."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, tag = m.group(2), m.group(3).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines))
        body = [line[len(m.group(1)):] if line.startswith(m.group(1)) else line for line in lines[i + 1:end]]
        prompted = _prompt_commands(body)
        if tag in ("bash", "sh", "shell") or tag == "console" or (not tag and prompted):
            where = f"{name}:{i + 1}"
            skip, subs = _directives(lines, i, where)
            script = "\n".join(body) if tag in ("bash", "sh", "shell") else "\n".join(prompted)
            for old, new in subs:
                if old not in script:
                    raise ValueError(f"{where}: substitute {old!r}: not in the block")
                script = script.replace(old, new)
            if not script.strip():
                raise ValueError(f"{where}: a runnable block with no command")
            blocks.append(Block(name, i + 1, script, skip, subs))
        i = end + 1
    return blocks


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _with_blocks() -> list[Path]:
    return [p for p in doc_files() if any(b.skip is None for b in extract(p.read_text(), p.name))]


# ---------------------------------------------------------------------------------------------
# The convention itself


SAMPLE = """# t
```
rrtrain sweep SWEEP.yaml --out DIR
```
<!-- substitute: 300 => 3 -->
<!-- substitute: big => small -->

```bash
rrtrain train x train.max_steps=300 size=big
```
<!-- not-run: needs 8 GPUs -->
```sh
torchrun --nproc_per_node=8 -m rrtrain.train x
```
```console
$ rrtrain params --size tiny \\
    --variants review
review 1
$ echo hi
hi
```
```
$ rrtrain status runs/x
```
"""


def test_extract_follows_the_convention():
    blocks = extract(SAMPLE, "s.md")
    assert [(b.line, b.skip) for b in blocks] == [(8, None), (12, "needs 8 GPUs"), (15, None), (22, None)]
    assert blocks[0].script == "rrtrain train x train.max_steps=3 size=small"
    assert blocks[2].script == "rrtrain params --size tiny \\\n    --variants review\necho hi"
    assert blocks[3].script == "rrtrain status runs/x"


@pytest.mark.parametrize("bad,why", [("<!-- not-run: -->\n```bash\nls\n```\n", "needs a reason"),
                                     ("<!-- substitute: a -> b -->\n```bash\nls a\n```\n", "OLD => NEW"),
                                     ("<!-- substitute: zz => b -->\n```bash\nls a\n```\n", "not in the block")])
def test_extract_refuses_bad_directives(bad, why):
    with pytest.raises(ValueError, match=why):
        extract(bad, "s.md")


def test_every_doc_parses():
    """A malformed directive anywhere fails here, even in a file whose blocks are all not-run."""
    for path in doc_files():
        extract(path.read_text(), path.name)


# ---------------------------------------------------------------------------------------------
# Running them


def _workdir(tmp: Path) -> Path:
    for name in LINKED:
        (tmp / name).symlink_to(REPO / name)
    return tmp


def _env() -> dict[str, str]:
    e = env()
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


# What the docs' commands import beyond a training run's forkserver.PRELOAD: the command line, rrtrain prep's
# `streaming` (whose package __init__ imports transformers), export's and eval's transformers.
PRELOAD = (*forkserver.PRELOAD, "rrtrain.cli.main", "streaming", "transformers")
SHIMMED = {"rrtrain": "rrtrain", "torchrun": "torch.distributed.run"}  # command -> the module it runs

SHIM = """#!{python} -S
# `{name}` for the docs' commands: `python -m {module} ARGS`, forked by the test's fork server
# (tests/forkserver.py) instead of a new interpreter; with start-up variables of its own, a new interpreter.
import json, os, signal, socket, sys
argv = [{python!r}, "-m", {module!r}, *sys.argv[1:]]
env = dict(os.environ)
if {{k: v for k, v in env.items() if k.startswith({prefixes!r})}} != {startup!r}:
    os.execv(argv[0], argv)
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    conn.connect({socket!r})
except OSError:  # the server has ended
    os.execv(argv[0], argv)
socket.send_fds(conn, [json.dumps({{"argv": argv, "env": env, "cwd": os.getcwd()}}).encode()], [1, 2])
pid = json.loads(conn.recv(4096))["pid"]
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the child has a session of its own
    signal.signal(sig, lambda s, _f: os.killpg(pid, s))
reply = conn.recv(4096)
code = json.loads(reply)["exit"] if reply else 1
if code < 0:  # died of a signal: so does this process, as the interpreter's would
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Optional[Path]]:
    """A folder that holds `rrtrain` and `torchrun` as children of one fork server for all the docs (the
    imports, torch's above all, are paid once, not by each command), put first on the commands' PATH; None
    (the installed commands, each a new interpreter) under RRTRAIN_TEST_FORKSERVER=0 or where no server starts.
    What a command starts itself (the sweep's runs, torchrun's ranks) is a new interpreter either way."""
    if os.environ.get(forkserver.ENV_SWITCH, "1") == "0" or tiers.fast_tier() or not hasattr(os, "fork"):
        yield None
        return
    e = _env()
    try:
        server = forkserver.Client(sys.executable, e, str(REPO), PRELOAD)
    except (OSError, RuntimeError) as err:
        print(f"tests: no fork server ({err}); the docs' commands start as new processes", file=sys.stderr)
        yield None
        return
    folder = tmp_path_factory.mktemp("doc-shims")
    for name, module in SHIMMED.items():
        (folder / name).write_text(SHIM.format(python=sys.executable, name=name, module=module,
                                               prefixes=forkserver.STARTUP_PREFIXES,
                                               startup=forkserver.startup_env(e), socket=server.path))
        (folder / name).chmod(0o755)
    try:
        yield folder
    finally:
        server.stop()  # what a failed block left running is killed; the server's CPU time counts in ours


@pytest.mark.slow
@pytest.mark.parametrize("path", _with_blocks(), ids=lambda p: p.name)
def test_doc_commands_run(path: Path, tmp_path: Path, shims: Optional[Path]):
    cwd = _workdir(tmp_path)
    e = _env()
    if shims is not None:
        e["PATH"] = str(shims) + os.pathsep + e["PATH"]
    for block in extract(path.read_text(), path.name):
        if block.skip is not None:
            continue
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.script], cwd=cwd, env=e,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        if proc.returncode != 0:
            pytest.fail(f"{path.relative_to(REPO)}:{block.line}: exit {proc.returncode}\n{block.script}\n"
                        f"--- output ---\n{(proc.stdout + proc.stderr)[-4000:]}", pytrace=False)

"""`rrtrain.core.dist.exit_process`: after a process group, a process ends as interpreter shutdown would leave it
(threads finished, atexit handlers run, output flushed, its exit status) but without finalising the interpreter,
where a gloo thread still releasing a collective's tensors aborts the process (SIGABRT). Without a group it is
a plain exit."""

from __future__ import annotations

import subprocess
import textwrap

from trainutil import PY, REPO, env, free_port

SCRIPT = textwrap.dedent('''
    import atexit, os, sys, threading, time
    import torch
    from rrtrain.core import dist

    out = sys.argv[1]

    def mark(name):
        with open(os.path.join(out, name), "w") as f:
            f.write("x")

    class Finalised:
        def __del__(self, _open=open, _path=os.path.join(out, "finalised")):  # bound now: modules are gone then
            with _open(_path, "w") as f:
                f.write("x")

    KEEP = Finalised()  # a module global: freed only when the interpreter finalises
    if sys.argv[2] == "group":
        info = dist.setup(60)
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0] and info.world_size == 1
    atexit.register(mark, "atexit")
    threading.Thread(target=lambda: (time.sleep(0.5), mark("thread"))).start()  # non-daemon: waited for
    sys.stdout.write("unflushed")  # a pipe: block-buffered, written only by the flush
    dist.exit_process(7)
''')


def run(tmp_path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "exit.py"
    script.write_text(SCRIPT)
    e = env()
    if mode == "group":  # a one-rank gloo group, as torchrun would set it up
        e.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return subprocess.run([PY, str(script), str(tmp_path), mode], cwd=REPO, env=e, capture_output=True, text=True,
                          timeout=120)


def test_after_a_group_it_finishes_like_shutdown_without_finalising(tmp_path):
    proc = run(tmp_path, "group")
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert proc.stdout == "unflushed"
    assert (tmp_path / "thread").exists() and (tmp_path / "atexit").exists()
    assert not (tmp_path / "finalised").exists()  # the interpreter was not finalised


def test_without_a_group_it_is_a_plain_exit(tmp_path):
    proc = run(tmp_path, "none")
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert proc.stdout == "unflushed"
    assert (tmp_path / "thread").exists() and (tmp_path / "atexit").exists() and (tmp_path / "finalised").exists()

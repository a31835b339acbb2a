"""Start-up cost: a training run imports only what it uses.

Each of these packages costs seconds and hundreds of MB per process when imported (streaming's package
`__init__` alone pulls in transformers and torchvision); a one-step tiny run needs none of them. Checking
the module table is cheap and, unlike a time or memory threshold, does not depend on how busy the machine is.
Runtime: one one-step tiny run, about 5 s.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from trainutil import PY, REPO, TINY, env

HEAVY = ("transformers", "torchvision", "deepspeed", "datasets", "matplotlib", "scipy", "pandas", "sklearn")

# Runs `rrtrain.train` as `python -m rrtrain.train` would, then writes the names of the loaded modules.
_RUN_AND_LIST = """
import atexit, json, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["rrtrain.train", *sys.argv[2:]]
runpy.run_module("rrtrain.train", run_name="__main__")
"""


@pytest.mark.slow  # a real `rrtrain.train` start in a fresh interpreter: out of make test-fast
def test_a_tiny_run_imports_no_heavy_package(tmp_path, stories_data):
    listing = tmp_path / "modules.json"
    proc = subprocess.run(
        [PY, "-c", _RUN_AND_LIST, str(listing), TINY, f"data.path={stories_data}", f"run.dir={tmp_path / 'run'}",
         "train.max_steps=1", "data.eval_batches=1"],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = set(json.loads(listing.read_text()))
    assert "streaming.base.dataset" in loaded  # the run did read through streaming
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"a one-step tiny run imported {heavy[:10]}"


@pytest.mark.slow
def test_the_deferred_streaming_package_still_completes_on_demand():
    """After the trainer's deferred import, `from streaming import ...` and package attributes work as usual."""
    code = ("import sys\n"
            "from rrtrain.core.lazy_import import streaming_module\n"
            "ds = streaming_module('streaming.base.dataset').StreamingDataset\n"
            "assert 'transformers' not in sys.modules\n"
            "import streaming\n"
            "from streaming import MDSWriter, StreamingDataset\n"
            "from streaming.base import StreamingDataLoader\n"
            "assert StreamingDataset is ds and streaming.__version__ and streaming.text and MDSWriter\n"
            "try:\n"
            "    streaming.no_such_name\n"
            "except AttributeError:\n"
            "    print('ok')\n")
    proc = subprocess.run([PY, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]

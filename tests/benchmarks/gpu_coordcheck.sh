#!/usr/bin/env bash
# The coordinate check of docs/transfer.md at the shapes of rr-60m to rr-1b on one CUDA GPU, unattended within
# TIME_LIMIT (5 minutes):
#
#   bash tests/benchmarks/gpu_coordcheck.sh
#
# `rrtrain coordcheck` (rrtrain/planning/coordcheck.py), every check in one process, on the GPU, fp32, on the
# built-in synthetic stories: VARIANT at BASE's depth and heads over the WIDTHS (d_model of rr-60m ... rr-1b, d_ff
# 4 d) under each of WIDTH_PARAMS, then at BASE's width over the DEPTHS (blocks of rr-60m ... rr-1b) under each of
# DEPTH_PARAMS; the base shape (model.base_d_model, base_n_layers) is BASE's. Each shape trains STEPS steps at the
# constant learning rate LR. It prints, per check, the last block's mean |h_t - h_0| after the last step per size
# and its change in log per doubling, then a table with a verdict: flat (|slope| < 0.1) or not. Under sp the width
# check climbs and under mup it should be flat; the depth check likewise for sp and completep.
#
# Conventions as gpu.sh's: nothing is installed; the interpreter is PYTHON, else .venv/bin/python when its torch
# sees CUDA, else python3, with this checkout on PYTHONPATH; it needs torch, numpy, pyyaml and matplotlib. A check
# that fails is reported and the others go on; what would start after TIME_LIMIT is skipped and listed, and a check
# still running at TIME_LIMIT is stopped. Exit status 0 when every planned check ran, else 1.
#
# Environment (defaults in brackets):
#   VARIANT [standard]   the residual rule
#   BASE [rr-60m]        the size preset whose depth, heads and shape are the base
#   WIDTHS [512 768 1024 1280 1536]   WIDTH_PARAMS [sp mup]
#   DEPTHS [8 12 16 20 24]            DEPTH_PARAMS [sp completep]
#   STEPS [3] SEEDS [1] LR [0.01] BATCH [8] SEQ [256]
#   EXTRA []             more key=value overrides for every check (e.g. model.residual.gate_rank=8)
#   TIME_LIMIT [290]     seconds for the whole script
#   OUT [a temporary directory]   each check's coordcheck.json and plots, in OUT/<axis>-<parametrization>
#   ALLOW_CPU [0]        1: run without CUDA, on the CPU (only to test this script on a CPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

die() { echo "gpu_coordcheck.sh: error: $*" >&2; exit 1; }
. tests/benchmarks/gpu_python.sh
gpu_python gpu_coordcheck.sh "torch, yaml, numpy, matplotlib"

export CC_VARIANT=${VARIANT:-standard} CC_BASE=${BASE:-rr-60m}
export CC_WIDTHS=${WIDTHS-"512 768 1024 1280 1536"} CC_WIDTH_PARAMS=${WIDTH_PARAMS-"sp mup"}
export CC_DEPTHS=${DEPTHS-"8 12 16 20 24"} CC_DEPTH_PARAMS=${DEPTH_PARAMS-"sp completep"}
export CC_STEPS=${STEPS:-3} CC_SEEDS=${SEEDS:-1} CC_LR=${LR:-0.01} CC_BATCH=${BATCH:-8} CC_SEQ=${SEQ:-256}
export CC_EXTRA=${EXTRA:-} CC_TIME_LIMIT=${TIME_LIMIT:-290}
export CC_DEVICE=cuda
[ "${ALLOW_CPU:-0}" = 1 ] && ! has_cuda "$PY" && CC_DEVICE=cpu
[ "$CC_TIME_LIMIT" -ge 30 ] 2>/dev/null || die "TIME_LIMIT must be at least 30 (seconds), got '$CC_TIME_LIMIT'"
export CC_OUT=${OUT:-$(mktemp -d -t gpu-coordcheck.XXXXXX)}
mkdir -p "$CC_OUT" || die "cannot create $CC_OUT"

exec "$PY" - <<'EOF'
import json
import os
import signal
import sys
import time

import torch

from rrtrain.cli.main import main
from rrtrain.planning.coordcheck import log_slope, last_layer_series
from rrtrain.sizing import presets

start = time.monotonic()
env = os.environ
limit = int(env["CC_TIME_LIMIT"])
base = presets().get(env["CC_BASE"])
if base is None:
    sys.exit(f"gpu_coordcheck.sh: error: BASE={env['CC_BASE']} is not a size preset")
device = env["CC_DEVICE"]
name = torch.cuda.get_device_name() if device == "cuda" else "cpu (ALLOW_CPU=1)"
print(f"gpu_coordcheck.sh: torch {torch.__version__} on {name}; {env['CC_VARIANT']} at {env['CC_BASE']}'s shape "
      f"(d_model {base.d_model}, {base.n_layers} blocks, {base.n_heads} heads), base shape the same; "
      f"{env['CC_STEPS']} steps at lr {env['CC_LR']}, {env['CC_BATCH']}x{env['CC_SEQ']} tokens", flush=True)
common = ["configs/train/tiny.yaml", f"model.size={env['CC_BASE']}", f"model.variant={env['CC_VARIANT']}",
          f"model.base_d_model={base.d_model}", f"model.base_n_layers={base.n_layers}", *env["CC_EXTRA"].split()]
checks = [("width", p, env["CC_WIDTHS"]) for p in env["CC_WIDTH_PARAMS"].split()]
checks += [("depth", p, env["CC_DEPTHS"]) for p in env["CC_DEPTH_PARAMS"].split()]
checks = [c for c in checks if c[2].split()]


class TimeUp(Exception):
    pass


def alarm(*_):
    raise TimeUp


signal.signal(signal.SIGALRM, alarm)
rows, missed = [], []
for axis, param, sizes in checks:
    left = limit - (time.monotonic() - start)
    what = f"{axis} {param} ({sizes})"
    if left < 5:
        missed.append(f"{what}: skipped, {left:.0f} s of the time budget left")
        continue
    out = os.path.join(env["CC_OUT"], f"{axis}-{param}")
    argv = ["coordcheck", *common, "--parametrization", param, f"--{axis}s", ",".join(sizes.split()),
            "--steps", env["CC_STEPS"], "--seeds", env["CC_SEEDS"], "--lr", env["CC_LR"], "--batch", env["CC_BATCH"],
            "--seq-len", env["CC_SEQ"], "--device", device, "--out", out]
    t0 = time.monotonic()
    signal.alarm(max(1, int(left)))
    try:
        rc = main(argv)
    except TimeUp:
        missed.append(f"{what}: stopped at the time limit")
        continue
    except Exception as err:  # noqa: BLE001 - reported, and the other checks go on
        missed.append(f"{what}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        continue
    finally:
        signal.alarm(0)
        if device == "cuda":
            torch.cuda.empty_cache()
    if rc != 0:
        missed.append(f"{what}: exit status {rc}")
        continue
    with open(os.path.join(out, "coordcheck.json")) as f:
        records = json.load(f)
    points = last_layer_series(records, "h_delta", axis).get(int(env["CC_STEPS"]), {})
    slope = log_slope(points)
    rows.append((axis, param, points, slope, time.monotonic() - t0))

print("\n| check | parametrization | last block's mean |h_t - h_0| per size | change in log per doubling | flat | s |")
print("| --- | --- | --- | --- | --- | --- |")
for axis, param, points, slope, secs in rows:
    values = ", ".join(f"{k}: {v:.3g}" for k, v in sorted(points.items()))
    flat = "—" if slope is None else ("yes" if abs(slope) < 0.1 else "no")
    print(f"| {axis} | {param} | {values} | {'—' if slope is None else f'{slope:+.3f}'} | {flat} | {secs:.0f} |")
for line in missed:
    print(f"not measured: {line}")
print(f"gpu_coordcheck.sh: {len(rows)} of {len(checks)} checks in {time.monotonic() - start:.0f} s; files in "
      f"{env['CC_OUT']}")
sys.exit(0 if len(rows) == len(checks) else 1)
EOF

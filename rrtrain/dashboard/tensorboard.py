"""`rrtrain dashboard SWEEP_DIR [--port P]`: TensorBoard on loopback over one logdir for the whole sweep.

The logdir (`SWEEP_DIR/.dashboard/logdir`, rebuilt at each start and swapped in atomically) holds one run per
run directory, named `SIZE/VARIANT/seedN` (`SIZE/VARIANT/POINT/seedN` in a grid, POINT as in its id: `lr3e-3`):
symlinks to the run's own event files, plus one event file written here from `metrics.jsonl` (the source of
truth) with
- the curves again under per-size tags (`SIZE/train_loss`, `SIZE/val_loss`, `SIZE/grad_norm`,
  `SIZE/gate_mean/BLOCK`), so that a custom-scalars chart per size shows exactly that size's variants;
- the HParams session (variant, size, seed, params, the grid keys -> final and best val loss, number of flags,
  flags);
- a histogram of each gated site's gate values at every diagnostic step (`gates/SITE`, from the trainer's
  `gate_hist` counts).
Runs are found by final.json / metrics.jsonl anywhere under the sweep directory, as the report finds them.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain.rundir import fields, readers
from rrtrain.rundir.layout import TENSORBOARD, run_dirs
from rrtrain.rundir.points import point_key, read_point

HOST = "127.0.0.1"  # loopback only: on a cluster, reach it through an SSH tunnel
SERIES = {"train_loss": "loss", "val_loss": "val_loss", "grad_norm": "grad_norm"}  # per-size tag -> metrics key


def run_identity(run: Path) -> tuple[str, str, str, readers.Final]:
    """(size, variant, seedN, final.json, empty while the run goes) from final.json, else config.yaml."""
    final = readers.read_final(run)
    who = readers.identity(final, {} if readers.has_identity(final) else readers.read_config(run))
    seed = who.seed if who.seed is not None else "x"
    return who.size or "unknown", who.variant or run.name, f"seed{seed}", final or readers.Final()


def run_point(run: Path) -> dict[str, Any]:
    """The run's grid point (config.yaml `run.point`; {} without a grid): a part of its name and its HParams."""
    return read_point(readers.read_config(run))


def layout(sizes: list[str]) -> dict[str, dict[str, list]]:
    """The custom-scalars layout: one category per size, its variants on one chart per quantity."""
    out = {}
    for size in sizes:
        s = re.escape(size)
        out[f"size {size}"] = {
            "train loss": ["Multiline", [rf"^{s}/train_loss$"]],
            "val loss": ["Multiline", [rf"^{s}/val_loss$"]],
            "grad norm": ["Multiline", [rf"^{s}/grad_norm$"]],
            "gate mean per block": ["Multiline", [rf"^{s}/gate_mean/\d+$"]],
        }
    return out


def _gate_histogram(writer, tag: str, counts: list[float], step: int) -> None:
    """One site's gate values at one diagnostic step, from the trainer's counts in equal bins on [0, 1]
    (each value stands at its bin's centre for the summary statistics)."""
    total = float(sum(counts))
    if not total:
        return
    n = len(counts)
    limits = [(i + 1) / n for i in range(n)]
    centres = [(i + 0.5) / n for i in range(n)]
    used = [x for x, k in zip(centres, counts) if k]
    writer.add_histogram_raw(tag, min=used[0], max=used[-1], num=total,
                             sum=sum(k * x for k, x in zip(counts, centres)),
                             sum_squares=sum(k * x * x for k, x in zip(counts, centres)),
                             bucket_limits=limits, bucket_counts=[float(k) for k in counts], global_step=step)


def write_derived(run: Path, out: Path, size: str, variant: str, seed: str, final: readers.Final,
                  sizes: Optional[list[str]], point: Optional[dict[str, Any]] = None) -> None:
    """The dashboard's own event file for one run (see the module docstring)."""
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    writer = SummaryWriter(str(out), filename_suffix=".rrtrain-dashboard")
    last_step = 0
    for rec in readers.read_tail(readers.metrics_path(run), None, only=None):
        step = fields.step(rec.get("step"))
        if step is None:
            continue
        last_step = max(last_step, step)
        if rec.get("kind") == "diag":
            for i, g in enumerate(_list(rec.get("gate_mean"))):
                if fields.is_number(g):
                    writer.add_scalar(f"{size}/gate_mean/{i:03d}", g, step)
            for i, counts in enumerate(_list(rec.get("gate_hist"))):
                if isinstance(counts, list) and all(fields.is_number(k) and k >= 0 for k in counts):
                    _gate_histogram(writer, f"gates/{i:03d}", counts, step)
            continue
        if rec.get("kind") is not None:
            continue
        for tag, key in SERIES.items():
            value = rec.get(key)
            if fields.is_number(value):
                writer.add_scalar(f"{size}/{tag}", value, step)
    flags = list(final.flags)
    metrics = {"hparams/final_val_loss": final.final_val_loss, "hparams/best_val_loss": final.best_val_loss,
               "hparams/n_flags": float(len(flags))}
    metrics = {k: float(v) for k, v in metrics.items() if v is not None}
    hp = {"variant": variant, "size": size, "seed": seed, "params": final.params or 0.0,
          "flags": ",".join(flags) or "none", "status": final.status or "running"}
    hp.update({k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v))
               for k, v in (point or {}).items()})  # the grid keys, under their dotted names
    for summary in hparams(hp, metrics):
        writer.file_writer.add_summary(summary)
    for key, value in metrics.items():
        writer.add_scalar(key, value, last_step)
    if sizes is not None:
        writer.add_custom_scalars(layout(sizes))
    writer.close()


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def build_logdir(sweep_dir: str | os.PathLike[str]) -> tuple[Path, list[str]]:
    """Build the sweep's logdir aside and swap it in with one rename; returns (logdir, run names)."""
    sweep = Path(sweep_dir)
    if not sweep.is_dir():
        raise UsageError(f"{sweep}: not a directory")
    home = sweep / ".dashboard"
    runs = [d for d in run_dirs(sweep) if home not in d.parents]
    if not runs:
        raise UsageError(f"{sweep}: no runs (no final.json or metrics.jsonl under it)")
    home.mkdir(exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="build-", dir=home))
    build.chmod(0o755)
    names: list[str] = []
    idents = [run_identity(r) for r in runs]
    sizes = sorted({i[0] for i in idents})
    for run, (size, variant, seed, final) in zip(runs, idents):
        point = run_point(run)
        name = f"{size}/{variant}/{point_key(point)}/{seed}" if point else f"{size}/{variant}/{seed}"
        while name in names:  # the same identity twice (e.g. a rerun in another directory)
            name += "+"
        names.append(name)
        out = build / name
        out.mkdir(parents=True)
        for event in sorted((run / TENSORBOARD).glob("events.out.tfevents.*")):
            (out / event.name).symlink_to(event.resolve())
        write_derived(run, out, size, variant, seed, final, sizes if len(names) == 1 else None, point)
    link, tmp_link = home / "logdir", home / f".logdir.{os.getpid()}"
    old = link.resolve() if link.is_symlink() else None
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(build.name)
    os.replace(tmp_link, link)
    if old is not None and old != build and old.parent == home:
        shutil.rmtree(old, ignore_errors=True)
    return link, names


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="rrtrain dashboard", description="TensorBoard on loopback over a sweep's runs")
    parser.add_argument("sweep_dir")
    parser.add_argument("--port", type=int, default=6006)
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    logdir, names = build_logdir(args.sweep_dir)
    print(f"rrtrain dashboard: {len(names)} runs from {args.sweep_dir} at http://{HOST}:{args.port}/", flush=True)
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", HOST,
           "--port", str(args.port), "--reload_interval", "15"]
    os.execv(sys.executable, cmd)  # TensorBoard takes over this process: Ctrl-C and signals reach it directly

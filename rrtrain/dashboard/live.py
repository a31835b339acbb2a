"""The dashboard's own event files, kept live by appending what is new.

Each run of the logdir has one derived event file, appended to (never rewritten) at every refresh from the new
lines of its metrics.jsonl (`rrtrain.rundir.tail.MetricsTail` reads only those): the per-size curves, the gate
means and histograms, the downstream results (in-loop records as `SIZE/downstream/TASK/METRIC`, and `rrtrain eval`'s
result files in the run's eval/ as `SIZE/eval/TASK/METRIC`, each at its checkpoint's step, read again when eval/
changes; a chart per task and metric of each size shows both, `rrtrain.rundir.downstream`), and each flag the
monitor raised (the run's `flags` text entry, with step and reason, and a point of `SIZE/flags` at the flag's step,
at the training loss there, drawn on the size's train-loss chart).
Pruned and cancelled runs get their flag when final.json or cancelled.json says so.

TensorBoard keeps the first HParams session a run holds (it reads a session from the tag's metadata, and keeps
only the first metadata per tag), so a second session appended to a run would never show. A run's session is
therefore a run of its own, `NAME/STATUS` (`tiny/review/seed0/running`): when the run's outcome changes, the
new session is written as a new small run and the old one's directory removed (TensorBoard drops a run whose
directory is gone).

The `_sweep` pseudo-run holds the custom-scalars layout (appended again when a size appears) and the sweep's
summary table (the `sweep` text entry), appended at each refresh that changed it. The table is what the
`summary` callable given to `SweepFeed` returns, asked at every refresh (`rrtrain dashboard` gives it the
`rrtrain status` table: `rrtrain.cli.dashboard`; this package knows nothing of launchers); without one, or
when it has none (a directory of runs with no sweep.json), a table built from the feeds here.

A run whose files are unchanged (metrics.jsonl, final.json, cancelled.json and its event directory, by stat)
costs four stats a refresh; nothing here waits on a run being written.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from rrtrain.core import files
from rrtrain.rundir import downstream, events, fields, layout as rundir_layout, readers
from rrtrain.rundir.events import EventFile
from rrtrain.rundir.outcome import CANCELLED, PRUNED, cancelled_status
from rrtrain.rundir.tail import FileKey, MetricsTail, file_key

SERIES = {"train_loss": "loss", "val_loss": "val_loss", "grad_norm": "grad_norm"}  # per-size tag -> metrics key
#: the HParams columns shown by default (with flags and params, the first two of the rest by name)
IDENTITY = ("variant", "size", "seed")
#: the suffix of every event file the dashboard writes (the runs' own are symlinked beside them)
SUFFIX = ".rrtrain-dashboard"
#: the pseudo-run with the layout and the sweep's summary table
SWEEP_RUN = "_sweep"
FLAGS_TAG = "flags"  # the text entry of a run's flags
DOWNSTREAM_TAG, EVAL_TAG = "downstream", "eval"  # SIZE/downstream/TASK/METRIC (in-loop), SIZE/eval/... (eval/ files)


def layout(sizes: list[str], results: Optional[dict[str, list[str]]] = None) -> dict[str, dict[str, list]]:
    """The custom-scalars layout: one category per size, its variants on one chart per quantity; the flags'
    markers (`SIZE/flags`) on the train-loss chart; `results` (size -> "TASK/METRIC" keys): a chart per downstream
    task and metric, in-loop and `rrtrain eval` values together."""
    out = {}
    for size in sizes:
        s = re.escape(size)
        out[f"size {size}"] = {
            "train loss": ["Multiline", [rf"^{s}/train_loss$", rf"^{s}/flags$"]],
            "val loss": ["Multiline", [rf"^{s}/val_loss$"]],
            "grad norm": ["Multiline", [rf"^{s}/grad_norm$"]],
            "gate mean per block": ["Multiline", [rf"^{s}/gate_mean/\d+$"]],
        }
        for key in (results or {}).get(size, []):
            task, metric = downstream.split_key(key)
            out[f"size {size}"][f"downstream {task} {metric}"] = [
                "Multiline", [rf"^{s}/({DOWNSTREAM_TAG}|{EVAL_TAG})/{re.escape(key)}$"]]
    return out


def show_first(experiment: Any, names: tuple[str, ...]) -> None:
    """Mark the HParams columns `names` as the ones that differ between runs. TensorBoard's HParams table shows
    five columns by default: those marked so first, then the rest by name (which left `variant` out)."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    value = experiment.value[0]
    data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        if info.name in names:
            info.differs = True
    value.metadata.plugin_data.content = data.SerializeToString()


def scalar(tag: str, value: float, step: int) -> Any:
    return events.event(events.scalars({tag: value}), step)


def text(tag: str, body: str, step: int) -> Any:
    return events.event(events.text(tag, body), step)


def gate_histogram(tag: str, counts: list[float], step: int) -> Optional[Any]:
    """One site's gate values at one diagnostic step, from the trainer's counts in equal bins on [0, 1]
    (each value stands at its bin's centre for the summary statistics); None when there is nothing counted."""
    from torch.utils.tensorboard import summary

    total = float(sum(counts))
    if not total:
        return None
    n = len(counts)
    centres = [(i + 0.5) / n for i in range(n)]
    used = [x for x, k in zip(centres, counts) if k]
    return events.event(summary.histogram_raw(tag, min=used[0], max=used[-1], num=total,
                                              sum=sum(k * x for k, x in zip(counts, centres)),
                                              sum_squares=sum(k * x * x for k, x in zip(counts, centres)),
                                              bucket_limits=[(i + 1) / n for i in range(n)],
                                              bucket_counts=[float(k) for k in counts]), step)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class RunFeed:
    """One run of the logdir kept live: its derived event file appended to, its symlinks to the run's own
    event files added as they appear, its HParams session replaced when its outcome changes."""

    def __init__(self, run: Path, out: Path, name: str, size: str, variant: str, seed: str,
                 point: Optional[dict[str, Any]] = None) -> None:
        self.run, self.out, self.name = run, out, name
        self.size, self.variant, self.seed, self.point = size, variant, seed, dict(point or {})
        out.mkdir(parents=True, exist_ok=True)
        existing = sorted(out.glob(f"events.out.tfevents.*{SUFFIX}"))
        self.file = EventFile(existing[0] if existing else out / events.new_name(SUFFIX))
        self.tail = MetricsTail(readers.metrics_path(run))
        self.generation = 0
        self.step = 0  # the newest step written: nothing is appended below it (TensorBoard would purge)
        self.loss: Optional[float] = None  # the newest training loss read
        self.shown: set[str] = set()  # the flags already on the charts
        self.session: Optional[tuple] = None  # what the current HParams session says
        self.session_dir: Optional[Path] = None
        self.used_names: set[str] = set()
        self.keys: Optional[tuple[Optional[FileKey], ...]] = None
        self.unlinkable: set[Path] = set()  # the run's event files that are loops of links, said once
        # what the sweep table shows
        self.status = "running"
        self.flags: dict[str, str] = {}
        # downstream results: the "TASK/METRIC" keys seen (a chart each), the eval/ values written, problems said
        self.results: set[str] = set()
        self.evals: dict[tuple[int, str], float] = {}
        self.eval_key: Optional[FileKey] = None
        self.said: set[str] = set()

    def _keys(self) -> tuple[Optional[FileKey], ...]:
        return (file_key(self.tail.path), file_key(self.run / rundir_layout.FINAL),
                file_key(self.run / rundir_layout.CANCELLED), file_key(self.run / rundir_layout.TENSORBOARD),
                file_key(self.run / rundir_layout.EVAL))

    def refresh(self) -> bool:
        """Append what is new; False when the run's files are as they were at the last refresh."""
        keys = self._keys()
        if keys == self.keys:
            return False
        self._link_events()
        new = self.tail.refresh()
        out: list[Any] = []
        if self.tail.generation != self.generation:
            # metrics.jsonl was replaced (a resume cut it back, a fresh start): it is read again from its start,
            # so TensorBoard is told to drop what this file said (a restart marker at step 0), as a resumed
            # run's own event file does after its checkpoint's step
            out.append(events.restart(0))
            self.generation, self.step, self.loss = self.tail.generation, 0, None
            self.shown, self.flags = set(), {}
            self.evals, self.eval_key = {}, None  # the restart dropped them too: written again below
        for rec in new:
            out.extend(self._from_record(rec))
        out.extend(self._eval_results(keys[4]))
        final = readers.read_final(self.run)
        cancelled = readers.read_cancelled(self.run)
        out.extend(self._outcome_flags(final, cancelled))
        self.file.append(out)
        self._session(final, cancelled)
        # a torn last line (or a read cut short) is read at the next refresh: look again then
        self.keys = keys if self.tail.key is not None or keys[0] is None else None
        return True

    def _eval_results(self, key: Optional[FileKey]) -> list[Any]:
        """`rrtrain eval`'s results new or changed since eval/ was last read, at their own steps (in step order
        within a refresh); a bad file is said once on stderr, as the dashboard says a skipped run."""
        if key == self.eval_key:
            return []
        self.eval_key = key
        problems: list[str] = []
        table = downstream.read_eval_dir(self.run, problems)
        for line in problems:
            if line not in self.said:
                self.said.add(line)
                print(f"rrtrain dashboard: {self.run}: {line}", file=sys.stderr, flush=True)
        out = []
        for step in sorted(table):
            for name, value in sorted(table[step].items()):
                if self.evals.get((step, name)) != value:
                    self.evals[(step, name)] = value
                    self.results.add(name)
                    out.append(scalar(f"{self.size}/{EVAL_TAG}/{name}", value, step))
        return out

    def _link_events(self) -> None:
        for src in sorted((self.run / rundir_layout.TENSORBOARD).glob("events.out.tfevents.*")):
            link = self.out / src.name
            if not link.is_symlink() and not link.exists():
                try:
                    target = src.resolve()
                except (OSError, RuntimeError):  # a loop of links: RuntimeError on Python 3.11, OSError later
                    if src not in self.unlinkable:
                        self.unlinkable.add(src)
                        print(f"rrtrain dashboard: skipping {src}: a loop of symbolic links", file=sys.stderr,
                              flush=True)
                    continue
                if not _regular(target):  # TensorBoard would open a FIFO and wait forever, for every run
                    if src not in self.unlinkable:
                        self.unlinkable.add(src)
                        print(f"rrtrain dashboard: skipping {src}: not a regular file", file=sys.stderr, flush=True)
                    continue
                link.symlink_to(target)

    def _at(self, step: int) -> int:
        self.step = max(self.step, step)
        return self.step

    def _from_record(self, rec: dict[str, Any]) -> list[Any]:
        step, kind, out = rec["step"], rec.get("kind"), []
        if kind == "diag":
            for i, g in enumerate(_list(rec.get("gate_mean"))):
                if fields.finite(g) is not None:
                    out.append(scalar(f"{self.size}/gate_mean/{i:03d}", g, self._at(step)))
            for i, counts in enumerate(_list(rec.get("gate_hist"))):
                if isinstance(counts, list) and counts and all(
                        fields.finite(k) is not None and k >= 0 for k in counts):
                    hist = gate_histogram(f"gates/{i:03d}", counts, self._at(step))
                    if hist is not None:
                        out.append(hist)
        elif kind == "flag":
            name = fields.text(rec.get("flag"))
            if name is not None:
                out.extend(self._flag(name, step, fields.text(rec.get("detail")) or ""))
        elif kind == downstream.KIND:
            got = downstream.record_values(rec)
            for name, value in sorted(got[1].items()) if got else []:
                self.results.add(name)
                out.append(scalar(f"{self.size}/{DOWNSTREAM_TAG}/{name}", value, self._at(step)))
        elif kind is None:
            for tag, key in SERIES.items():
                value = fields.finite(rec.get(key))
                if value is not None:
                    out.append(scalar(f"{self.size}/{tag}", value, self._at(step)))
            loss = fields.finite(rec.get("loss"))
            if loss is not None:
                self.loss = loss
        return out

    def _flag(self, name: str, step: Optional[int], why: str) -> list[Any]:
        """A flag's text entry and its marker, once per flag name."""
        self.flags.setdefault(name, why)
        if name in self.shown:
            return []
        self.shown.add(name)
        at = self._at(step if step is not None else self.step)
        out = [text(FLAGS_TAG, f"**{name}** at step {at}: {why or 'no reason recorded'}", at)]
        if self.loss is not None:
            out.append(scalar(f"{self.size}/{FLAGS_TAG}", self.loss, at))
        return out

    def _outcome_flags(self, final: Optional[readers.Final], cancelled: Optional[readers.Cancelled]) -> list[Any]:
        """The flags final.json and cancelled.json add: the run's own (a run read from its start has them as
        metrics lines too), pruned, cancelled."""
        out: list[Any] = []
        at = final.step if final is not None and final.step is not None else None
        if final is not None:
            for name in final.flags:
                out.extend(self._flag(name, at, final.flag_details.get(name, "in final.json")))
            if final.status == PRUNED:
                out.extend(self._flag(PRUNED, at, final.reason))
        if cancelled is not None:
            out.extend(self._flag(CANCELLED, at, cancelled.reason))
        return out

    def _session(self, final: Optional[readers.Final], cancelled: Optional[readers.Cancelled]) -> None:
        """Write the run's HParams session again when what it says changed (see the module docstring)."""
        f = final or readers.Final()
        status = f.status or (cancelled_status(cancelled) if cancelled is not None else "running")
        if not re.fullmatch(r"[a-z_]{1,32}", status):
            status = "unknown"  # a name read from final.json becomes a directory: a plain word only
        self.status = status
        flags = sorted(self.flags)
        metrics = {"hparams/final_val_loss": f.final_val_loss, "hparams/best_val_loss": f.best_val_loss,
                   "hparams/n_flags": float(len(flags))}
        metrics = {k: float(v) for k, v in metrics.items() if v is not None}
        hp = {"variant": self.variant, "size": self.size, "seed": self.seed, "params": f.params or 0.0,
              "flags": ",".join(flags) or "none", "status": status}
        hp.update({k: (float(v) if fields.is_number(v) else str(v)) for k, v in self.point.items()})
        says = (tuple(sorted(hp.items(), key=lambda kv: kv[0])), tuple(sorted(metrics.items())))
        if says == self.session:
            return
        from torch.utils.tensorboard.summary import hparams

        name, k = status, 1
        while name in self.used_names:  # a name TensorBoard may still hold: never reused
            k += 1
            name = f"{status}.{k}"
        self.used_names.add(name)
        new_dir = self.out / name
        files.make_dir(new_dir)  # marked: replaced (deleted) when the outcome changes again
        experiment, start, end = hparams(hp, metrics)
        show_first(experiment, IDENTITY)
        out = [events.event(s, 0) for s in (experiment, start, end)]
        out += [scalar(key, value, 0) for key, value in metrics.items()]
        EventFile(new_dir / events.new_name(SUFFIX)).append(out)
        if self.session_dir is not None:
            files.discard_made_dir(self.session_dir)
        self.session, self.session_dir = says, new_dir

    def row(self) -> str:
        """This run's line of the sweep table (markdown)."""
        def num(v: Any, fmt: str) -> str:
            return format(v, fmt) if v is not None else "-"

        val = self.tail.val.get("val_loss") if self.tail.val else None
        flags = ", ".join(f"{n} ({w})" if w else n for n, w in sorted(self.flags.items())) or ""
        return (f"| {self.name} | {self.status} | {num(self.tail.last_step, 'd')} | {num(self.loss, '.4f')} | "
                f"{num(fields.finite(val), '.4f')} | {flags.replace('|', '/')} |")


#: the sweep's summary as markdown, asked at every refresh; None: it has none (the feeds' own table is shown)
Summary = Callable[[], Optional[str]]


class SweepFeed:
    """The `_sweep` pseudo-run: the custom-scalars layout and the sweep's summary table, appended as they
    change (a new step each time). `summary` gives the table (see the module docstring)."""

    def __init__(self, out: Path, summary: Optional[Summary] = None) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.file = EventFile(out / events.new_name(SUFFIX))
        self.summary = summary
        self.sizes: list[str] = []
        self.results: dict[str, list[str]] = {}  # size -> the downstream "TASK/METRIC" keys charted
        self.step = 0
        self.table = ""

    def refresh(self, feeds: list[RunFeed]) -> None:
        from torch.utils.tensorboard import summary

        out = []
        sizes = sorted({f.size for f in feeds})
        results = {size: sorted({k for f in feeds if f.size == size for k in f.results}) for size in sizes}
        results = {size: keys for size, keys in results.items() if keys}
        if sizes != self.sizes or results != self.results:
            self.step += 1
            out.append(events.event(summary.custom_scalars(layout(sizes, results)), self.step))
            self.sizes, self.results = sizes, results
        table = self.summary() if self.summary is not None else None
        if table is None:
            table = feeds_table(feeds)
        if table != self.table:
            self.step += 1
            out.append(text("sweep", table, self.step))
            self.table = table
        self.file.append(out)


def feeds_table(feeds: list[RunFeed]) -> str:
    """The sweep table the dashboard builds from its own feeds (run, state, step, losses, flags), for a directory
    of runs that has no other summary; the runs needing attention first."""
    order = {"failed": 0, "diverged": 1, "stalled": 2, "unknown": 3, "running": 5}
    rows = sorted(feeds, key=lambda f: (order.get(f.status, 4), not f.flags, f.name))
    counts: dict[str, int] = {}
    for f in feeds:
        counts[f.status] = counts.get(f.status, 0) + 1
    return "\n".join(["| run | state | step | loss | val | flags |", "| --- | --- | --- | --- | --- | --- |",
                      *(f.row() for f in rows), "",
                      "  ".join(f"{s}: {n}" for s, n in sorted(counts.items())) + f"  (total {len(feeds)})"])


def refresh_all(feeds: list[RunFeed], sweep: Optional[SweepFeed]) -> int:
    """Refresh every run's feed, then the sweep's; the number of runs that changed."""
    changed = sum(1 for f in feeds if f.refresh())
    if sweep is not None:
        sweep.refresh(feeds)
    return changed


def _regular(path: Path) -> bool:
    """Whether `path` (resolved: no link left) is a regular file, without opening it."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False

"""Downstream results in `rrtrain report`: the reader (`rrtrain.rundir.downstream`: in-loop records and `rrtrain
eval`'s result files merged, the file winning, stderr left out, bad files skipped with a line), the tables per task
and primary metric (mean ± SD per size, Welch against scipy, direction: higher acc and lower bits_per_byte are
better), the CSV and JSON outputs, a grid's tables at each variant's point chosen by the loss, and a sweep without
downstream results reported exactly as before."""

from __future__ import annotations

import csv
import io
import json
import os

import numpy as np
import pytest
import scipy.stats as sps
from unit.rrtrain.report.test_report_grid import write_run

from rrtrain.report import render
from rrtrain.report.analysis import analyze
from rrtrain.report.collect import find_runs, read_run
from rrtrain.report.downstream import with_downstream
from rrtrain.report.grid import analyze_grid
from rrtrain.report.options import Options
from rrtrain.rundir import downstream, layout

SEEDS = (0, 1, 2)
# the final (step 9) values per variant and seed: review has the higher (better) acc and the lower (better)
# bits_per_byte than standard; highway has the better acc_norm than review
ACC = {"review": [0.60, 0.62, 0.61], "standard": [0.50, 0.52, 0.515], "highway": [0.61, 0.58, 0.64]}
ACC_NORM = {"review": [0.70, 0.71, 0.72], "standard": [0.69, 0.72, 0.70], "highway": [0.80, 0.81, 0.825]}
BPB = {"review": [1.10, 1.12, 1.11], "standard": [1.30, 1.31, 1.285], "highway": [1.12, 1.09, 1.115]}
LOSS = {"review": 2.0, "standard": 2.1, "highway": 2.05}


def add_records(run_dir, records) -> None:
    with open(run_dir / layout.METRICS, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def write_eval(run_dir, step, key, results, **extra) -> None:
    d = run_dir / layout.EVAL
    d.mkdir(exist_ok=True)
    body = {"step": step, "tasks": sorted(results), "num_fewshot": None, "limit": None, "source": "eval",
            "seconds": 0.5, "lm_eval_version": "0.4.0", "results": results, **extra}
    (d / f"step_{step:08d}-{key}.json").write_text(json.dumps(body))


def downstream_run(root, size, variant, seed, params, point=None, loss=None):
    """A run (test_report_grid's) with in-loop records at steps 5 and 9 and, for review, an eval file at step 9
    that overrides the records' mc/acc (the records there say 0.1: the file must win)."""
    write_run(root, size, variant, seed, point or {}, loss if loss is not None else LOSS[variant] + 0.01 * seed,
              params=params)
    (run,) = [d for d in root.iterdir() if d.name.startswith(f"{size}-{variant}-") and d.name.endswith(f"-s{seed}")
              and (point is None or all(f"{k}{v}" in d.name for k, v in point.items()))]
    acc, bpb = ACC[variant][seed], BPB[variant][seed]
    early = {"kind": "downstream", "step": 5, "seconds": 0.2, "downstream/mc/acc": acc - 0.1,
             "downstream/ppl/bits_per_byte": bpb + 0.5}
    last = {"kind": "downstream", "step": 9, "seconds": 0.2,
            "downstream/mc/acc": 0.1 if variant == "review" else acc, "downstream/mc/acc_stderr": 0.01,
            "downstream/mc/acc_norm": ACC_NORM[variant][seed], "downstream/ppl/bits_per_byte": bpb,
            "downstream/ppl/word_perplexity": 2 ** bpb * 3, "downstream/ppl/bits_per_byte_stderr": 0.02}
    add_records(run, [early, last])
    if variant == "review":
        write_eval(run, 9, "mc", {"mc": {"acc": acc, "acc_stderr": 0.011}})
    return run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("downstream")
    for size, params in (("tiny", 1e6), ("small", 4e6)):
        for variant in ACC:
            for seed in SEEDS:
                downstream_run(root, size, variant, seed, params)
    return root


@pytest.fixture(scope="module")
def analysis(sweep):
    return with_downstream(analyze(find_runs(sweep), Options()))


def table(a, task, metric):
    (t,) = [t for t in a.downstream.tables if (t.task, t.metric) == (task, metric)]
    return t


def test_the_reader_merges_both_sources_and_leaves_out_stderr(sweep):
    (run,) = [d for d in sweep.iterdir() if d.name.startswith("tiny-review-") and d.name.endswith("-s0")]
    problems: list[str] = []
    got = downstream.read_downstream(run, problems)
    assert problems == [] and sorted(got) == [5, 9]
    assert got[9]["mc/acc"] == ACC["review"][0]  # the eval file's value, not the record's 0.1
    assert got[5] == {"mc/acc": pytest.approx(0.5), "ppl/bits_per_byte": pytest.approx(1.6)}
    assert not any(k.endswith("_stderr") for values in got.values() for k in values)
    step, values = downstream.final(got)
    assert step == 9 and set(values) == {"mc/acc", "mc/acc_norm", "ppl/bits_per_byte", "ppl/word_perplexity"}
    # the report's reader keeps only the final step and gets the same values
    r = read_run(run, sweep)
    assert (r.downstream_step, r.downstream) == (step, values)


def test_a_resumed_run_keeps_the_last_record_of_a_step_and_the_largest_step_is_final(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    add_records(run, [{"kind": "downstream", "step": 4, "downstream/mc/acc": 0.3},
                      {"kind": "downstream", "step": 8, "downstream/mc/acc": 0.4},
                      {"kind": "downstream", "step": 4, "downstream/mc/acc": 0.35},  # re-logged after a resume
                      {"kind": "downstream", "step": "8", "downstream/mc/acc": 0.9},  # not a step
                      {"kind": "downstream", "step": 9, "downstream/../x/acc": 0.9, "downstream/mc/acc": "high"}])
    write_eval(run, 2, "ppl", {"ppl": {"bits_per_byte": 1.5, "word_perplexity": None}})
    got = downstream.read_downstream(run)
    assert got == {2: {"ppl/bits_per_byte": 1.5}, 4: {"mc/acc": 0.35}, 8: {"mc/acc": 0.4}}
    assert downstream.final(got) == (8, {"mc/acc": 0.4})
    assert downstream.final({}) == (None, {})


def test_tables_per_task_and_primary_metric_with_welch_against_scipy(analysis):
    a = analysis
    assert a.reference == "review" and a.baselines == ["highway", "standard"]
    names = [(t.task, t.metric) for t in a.downstream.tables]
    assert names == [("mc", "acc"), ("mc", "acc_norm"), ("ppl", "bits_per_byte"), ("ppl", "word_perplexity")]
    assert a.downstream.why == {"mc": "multiple choice: acc and acc_norm",
                                "ppl": "perplexity: bits_per_byte and word_perplexity"}
    for task, metric, values in (("mc", "acc", ACC), ("mc", "acc_norm", ACC_NORM), ("ppl", "bits_per_byte", BPB)):
        t = table(a, task, metric)
        assert t.steps == {9: 18} and t.missing == 0
        assert [s.size for s in t.analysis.sizes] == ["tiny", "small"]  # ordered by parameters, as the loss table
        for s in t.analysis.sizes:
            ref = s.variants["review"]
            assert ref.n == 3 and ref.mean == pytest.approx(np.mean(values["review"]))
            assert ref.sd == pytest.approx(np.std(values["review"], ddof=1))
            for b in ("highway", "standard"):
                c = s.comparisons[b]
                want = sps.ttest_ind(values[b], values["review"], equal_var=False)
                assert c.p == pytest.approx(want.pvalue, rel=1e-12) and c.t == pytest.approx(want.statistic)
                assert c.diff == pytest.approx(np.mean(values[b]) - np.mean(values["review"]))
    # Holm over every downstream test (4 tables x 2 sizes x 2 baselines), apart from the loss table's
    comps = [c for t in a.downstream.tables for s in t.analysis.sizes for c in s.comparisons.values()]
    adjusted = sorted(c.p_holm for c in comps)
    assert len(comps) == 16 and adjusted[0] == pytest.approx(16 * min(c.p for c in comps))


def test_direction_decides_which_variant_is_better(analysis):
    acc = table(analysis, "mc", "acc").analysis.sizes[0].comparisons["standard"]
    assert acc.diff < 0 and acc.better == "review" and acc.verdict == "yes"  # higher acc: review better
    bpb = table(analysis, "ppl", "bits_per_byte").analysis.sizes[0].comparisons["standard"]
    assert bpb.diff > 0 and bpb.better == "review" and bpb.verdict == "yes"  # lower bits per byte: review better
    norm = table(analysis, "mc", "acc_norm").analysis.sizes[0].comparisons["highway"]
    assert norm.diff > 0 and norm.better == "highway" and norm.verdict == "yes"  # higher acc_norm: highway better
    md = render.report_md(analysis, {}, "sweep")
    section = md[md.index("## Downstream tasks"):md.index("## Across sizes")]
    assert "### mc: acc (higher is better)" in section and "### ppl: bits_per_byte (lower is better)" in section
    acc_table = section[section.index("### mc: acc (higher"):section.index("### mc: acc_norm")]
    assert "| tiny (~1M) | 0.6100 ± 0.0100 (3) |" in acc_table
    assert "standard: yes (t=-" in acc_table  # review better, with a negative difference
    norm_table = section[section.index("### mc: acc_norm"):section.index("### ppl: bits_per_byte")]
    assert "highway: yes, highway better (t=" in norm_table
    bpb_table = section[section.index("### ppl: bits_per_byte"):section.index("### ppl: word_perplexity")]
    assert "standard: yes (t=" in bpb_table and "standard: yes (t=-" not in bpb_table
    assert "Values at step 9." in acc_table
    assert "| mc/acc | tiny | standard − review | 3, 3 |" in section  # the downstream Welch table
    assert "yes, review better" in section and "negative difference means review is better" in section


def test_outputs_of_the_command(sweep, tmp_path):
    from rrtrain.cli.report import main

    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md.index("## Losses and stability per variant") < md.index("## Downstream tasks") < md.index("## Across")
    summary = json.loads((out / "summary.json").read_text())
    acc = summary["downstream"]["tables"]["mc/acc"]
    assert acc["higher_is_better"] is True and acc["steps"] == {"9": 18}
    tiny = acc["sizes"][0]
    assert tiny["variants"]["review"]["values"] == ACC["review"]
    assert tiny["comparisons"]["standard"]["better"] == "review"
    rows = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert header[:len(render.CSV_FIELDS)] == render.CSV_FIELDS
    assert header[len(render.CSV_FIELDS):] == ["downstream_step", "downstream/mc/acc", "downstream/mc/acc_norm",
                                              "downstream/ppl/bits_per_byte", "downstream/ppl/word_perplexity"]
    review0 = [r for r in rows if r["variant"] == "review" and r["seed"] == "0" and r["size"] == "tiny"][0]
    assert float(review0["downstream/mc/acc"]) == ACC["review"][0] and review0["downstream_step"] == "9"


def test_a_sweep_without_downstream_results_is_reported_as_before(tmp_path):
    for variant in ("review", "standard"):
        for seed in SEEDS:
            write_run(tmp_path, "tiny", variant, seed, {}, LOSS[variant] + 0.01 * seed)
    a = with_downstream(analyze(find_runs(tmp_path), Options()))
    assert a.downstream is None
    assert "Downstream" not in render.report_md(a, {}, "sweep")
    assert "downstream" not in render.summary(a, {}, str(tmp_path))
    assert render.results_csv(a).splitlines()[0] == ",".join(render.CSV_FIELDS)


def test_bad_result_files_are_skipped_with_a_line_each(tmp_path, monkeypatch):
    monkeypatch.setattr(downstream, "MAX_FILE_BYTES", 4096)
    root = tmp_path / "sweep"
    root.mkdir()
    run = downstream_run(root, "tiny", "standard", 0, 1e6)
    outside = tmp_path / "outside.json"  # a link out of the run: never followed
    outside.write_text(json.dumps({"step": 9, "results": {"mc": {"acc": 0.99}}}))
    d = run / layout.EVAL
    d.mkdir()
    (d / "step_00000009-link.json").symlink_to(outside)
    os.mkfifo(d / "step_00000009-fifo.json")  # would block a reader that waits for a writer
    (d / "step_00000009-torn.json").write_text('{"step": 9, "results": {"mc": {"acc": 0.')
    (d / "step_00000009-list.json").write_text("[1, 2]")
    (d / "step_00000009-huge.json").write_text(json.dumps({"step": 9, "results": {"mc": {"acc": 0.98}},
                                                           "pad": "x" * 5000}))
    (d / "step_00000007-other.json").write_text(json.dumps({"step": 9, "results": {"mc": {"acc": 0.97}}}))
    (d / "step_00000009-noresults.json").write_text(json.dumps({"step": 9, "results": [0.9]}))
    (d / "notes.txt").write_text("not a result file: not read")
    r = read_run(run, root)
    assert r.downstream["mc/acc"] == ACC["standard"][0]  # the records' value: no bad file counted
    lines = sorted(p for p in r.problems if p.startswith("eval/"))
    assert len(lines) == 7, lines
    assert any("link.json unreadable: a link (not followed)" in p for p in lines)
    assert any("fifo.json unreadable: not a regular file" in p for p in lines)
    assert any("torn.json unreadable: JSONDecodeError" in p for p in lines)
    assert any("list.json unreadable: not a JSON object" in p for p in lines)
    assert any("huge.json unreadable: larger than 4096 bytes" in p for p in lines)
    assert any("step_00000007-other.json unreadable: its 'step' (9) is not the step of its name (7)" in p
               for p in lines)
    assert any("noresults.json unreadable: 'results' is not an object" in p for p in lines)
    # eval/ itself a link out of the run, or a file: one line, nothing read
    other = downstream_run(root, "tiny", "standard", 1, 1e6)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "step_00000009-mc.json").write_text(outside.read_text())
    (other / layout.EVAL).symlink_to(tmp_path / "elsewhere")
    third = downstream_run(root, "tiny", "standard", 2, 1e6)
    (third / layout.EVAL).write_text("not a directory")
    r1, r2 = read_run(other, root), read_run(third, root)
    assert r1.downstream["mc/acc"] == ACC["standard"][1] and "eval/ unreadable: a link (not followed)" in r1.problems
    assert "eval/ unreadable: not a directory" in r2.problems
    # the whole report: the problems reach results.csv, nothing is raised
    a = with_downstream(analyze(find_runs(root), Options()))
    text = render.results_csv(a)
    assert "fifo.json unreadable: not a regular file" in text and a.downstream is not None


def test_eval_dirs_are_not_searched_for_runs_inside_a_run_but_are_elsewhere(tmp_path):
    run = tmp_path / "a"
    (run / layout.EVAL / "nested").mkdir(parents=True)
    (run / layout.METRICS).write_text("")
    (run / layout.EVAL / "nested" / layout.METRICS).write_text("")  # inside a run's eval/: not a run
    elsewhere = tmp_path / "eval" / "b"  # a sweep's own folder called eval: searched
    elsewhere.mkdir(parents=True)
    (elsewhere / layout.METRICS).write_text("")
    assert layout.run_dirs(tmp_path) == [run, elsewhere]


def test_a_grid_reports_downstream_at_each_variants_point_chosen_by_the_loss(tmp_path):
    """lr 1e-3 wins on seed 0's loss for both variants; the tables use seeds 1 and 2 at that point only (the
    other point's downstream values, which would reverse the verdict, are never read into them)."""
    for variant in ("review", "standard"):
        for lr, base in ((1e-3, 2.0), (3e-3, 2.5)):
            for seed in SEEDS:
                run = downstream_run(tmp_path, "tiny", variant, seed, 1e6, point={"train.lr": lr},
                                     loss=base + 0.01 * seed + (0.1 if variant == "standard" else 0.0))
                if lr == 3e-3:  # the point not chosen: reversed accuracies at a later step
                    add_records(run, [{"kind": "downstream", "step": 9, "downstream/mc/acc": 1 - ACC[variant][seed]}])
                    write_eval(run, 9, "mc", {"mc": {"acc": 1 - ACC[variant][seed]}})
    ga = analyze_grid(find_runs(tmp_path), Options(select_seeds=1))
    with_downstream(ga.selected)
    assert {g.variant: g.chosen for g in ga.groups} == {"review": {"train.lr": 1e-3}, "standard": {"train.lr": 1e-3}}
    t = table(ga.selected, "mc", "acc")
    s = t.analysis.sizes[0]
    assert s.variants["review"].seeds == [1, 2] and s.variants["review"].losses == ACC["review"][1:]
    assert s.variants["standard"].losses == ACC["standard"][1:]
    c = s.comparisons["standard"]
    want = sps.ttest_ind(ACC["standard"][1:], ACC["review"][1:], equal_var=False)
    assert c.p == pytest.approx(want.pvalue) and c.better == "review"
    from rrtrain.cli.report import main

    out = tmp_path / "out"
    assert main([str(tmp_path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md.count("## Downstream tasks") == 1 and "### mc: acc (higher is better)" in md


def test_metric_names_as_lm_eval_spells_them(tmp_path):
    """`acc,none` is `acc`; a filtered metric keeps its filter and its direction; stderr in either spelling, and
    names that are not plain (a path, markup), are left out."""
    run = tmp_path / "r"
    run.mkdir()
    write_eval(run, 3, "gsm", {"gsm8k": {"exact_match,strict-match": 0.2, "exact_match_stderr,strict-match": 0.01,
                                         "exact_match.flexible-extract": 0.3,
                                         "exact_match.flexible-extract_stderr": 0.01, "alias": "gsm8k"},
                               "arc": {"acc,none": 0.4, "acc_stderr,none": 0.02, "<b>x</b>": 1.0},
                               "../etc": {"acc": 0.9}})
    assert downstream.read_downstream(run) == {3: {"gsm8k/exact_match,strict-match": 0.2,
                                                   "gsm8k/exact_match.flexible-extract": 0.3, "arc/acc": 0.4}}
    from rrtrain.report.downstream import higher_is_better, primary

    assert higher_is_better("exact_match,strict-match") is True and higher_is_better("bits_per_byte") is False
    assert higher_is_better("exact_match.flexible-extract") is True  # rrtrain eval's spelling of a filter
    assert higher_is_better("alias") is None
    assert primary({"perplexity", "acc"}) == (["acc"], "multiple choice: acc")
    assert primary({"word_perplexity", "byte_perplexity", "bits_per_byte"})[0] == ["bits_per_byte", "word_perplexity"]


def test_a_side_without_spread_is_tested_quietly():
    """Accuracy on a few documents is often the same on every seed: the test still runs (from the other side's
    spread, as scipy computes it) and says nothing on stderr."""
    import warnings

    from rrtrain.report.downstream import _stats, compare

    ref, base = _stats("review", [0, 1], [0.5, 0.75]), _stats("standard", [0, 1], [0.75, 0.75])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = compare(ref, base, 0.05, higher=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy's own, on the reference computation
        want = sps.ttest_ind([0.75, 0.75], [0.5, 0.75], equal_var=False)
    assert c.t == pytest.approx(want.statistic) and c.p == pytest.approx(want.pvalue) and c.better == "standard"
    same = compare(_stats("review", [0, 1], [1.0, 1.0]), _stats("standard", [0, 1], [1.0, 1.0]), 0.05, True)
    assert same.verdict == "n/a" and same.reason == "no seed-to-seed spread on either side" and same.better is None


def test_notes_say_when_steps_differ_or_a_run_has_no_value(tmp_path):
    for variant in ("review", "standard"):
        for seed in SEEDS:
            write_run(tmp_path, "tiny", variant, seed, {}, LOSS[variant] + 0.01 * seed)
            (run,) = tmp_path.glob(f"tiny-{variant}--s{seed}")
            if (variant, seed) == ("standard", 2):
                continue  # in the loss means, no downstream value at all
            add_records(run, [{"kind": "downstream", "step": 5 if seed == 0 else 9,
                               "downstream/ARC_Mix/acc": ACC[variant][seed]}])
    a = with_downstream(analyze(find_runs(tmp_path), Options()))
    t = table(a, "ARC_Mix", "acc")
    assert t.steps == {5: 2, 9: 3} and t.missing == 1
    md = render.report_md(a, {}, "sweep")
    assert ("The runs' last evaluated steps differ: step 5 (2 runs), step 9 (3 runs); 1 run(s) in the loss means "
            "have no acc for ARC_Mix.") in md

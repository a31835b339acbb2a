"""Expansion into runs, matching, sweep.json merging (idempotence, refusal of changed runs), rendering."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from launchers.sweep import record, spec
from launchers.sweep.expand import data_path, expand
from launchers.executors.render import render
from launchers.executors.entry import rendezvous_path
from launchers.torchrun import rendezvous
from rrtrain.config import Config
from rrtrain.config_load import build
from rrtrain.core.errors import UsageError
from rrtrain.sizing import count_params
from rrtrain.resolve import resolve_model_shape
from trainutil import REPO

BASE = {"name": "t", "config": "tiny.yaml", "data": "/data/x", "variants": ["review", "highway", "standard"],
        "match": "review", "overrides": {"train": {"log_every": 1}},
        "sizes": {"tiny": {"seeds": 2, "tokens": 40960, "overrides": {"model.n_layers": 2}},
                  "rr-60m": {"seeds": 1, "tokens": 10 ** 9, "resources": {"gpus_per_node": 8, "time_min": 600}}},
        "runs": {"tiny-highway-s1": {"train.lr": 0.01}},
        "resources": {"time_min": 30, "mem_gb": 8}}


def load(tmp_path: Path, body: dict, name: str = "sweep.yaml") -> spec.Sweep:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(body, sort_keys=False))
    return spec.load(p)


def runs_of(tmp_path: Path, body: dict = BASE):
    sweep = load(tmp_path, body)
    out = tmp_path / "out"
    return sweep, out, expand(sweep, out, data_path(sweep, out))


def test_ids_dirs_and_override_order(tmp_path):
    sweep, out, runs = runs_of(tmp_path)
    assert [r.id for r in runs] == ["tiny-review-s0", "tiny-review-s1", "tiny-highway-s0", "tiny-highway-s1",
                                    "tiny-standard-s0", "tiny-standard-s1", "rr-60m-review-s0",
                                    "rr-60m-highway-s0", "rr-60m-standard-s0"]
    by = {r.id: r for r in runs}
    r = by["tiny-highway-s1"]
    assert r.dir == (out / "tiny-highway-s1").resolve()
    c = r.config
    assert (c["model"]["size"], c["model"]["variant"], c["train"]["seed"]) == ("tiny", "highway", 1)
    assert c["train"]["lr"] == 0.01 and by["tiny-highway-s0"].config["train"]["lr"] == 0.003  # per run / base
    assert c["train"]["log_every"] == 1 and c["model"]["n_layers"] == 2  # sweep and size overrides
    assert by["rr-60m-review-s0"].config["model"]["n_layers"] is None
    assert c["data"]["path"] == "/data/x" and c["train"]["tokens"] == 40960
    assert by["rr-60m-review-s0"].resources.gpus_per_node == 8 and by["rr-60m-review-s0"].resources.tasks == 8
    assert r.resources.time_min == 30 and r.resources.mem_gb == 8 and r.resources.tasks == 1


def test_match_widens_baselines_to_reference(tmp_path):
    _, _, runs = runs_of(tmp_path)
    counts = {}
    for r in runs:
        if r.size == "rr-60m":
            cfg = build(Config, r.config)
            shape = resolve_model_shape(cfg, None, None)
            counts[r.variant] = count_params(shape, r.variant, cfg.model.residual)
    ref = counts["review"]
    assert all(abs(n - ref) <= 0.005 * ref for n in counts.values()), counts


def test_per_run_override_errors(tmp_path):
    with pytest.raises(UsageError, match=r"runs: no run 'tiny-review-s9' in this sweep \(did you mean"):
        runs_of(tmp_path, {**BASE, "runs": {"tiny-review-s9": {"train.lr": 1}}})
    with pytest.raises(UsageError, match="train.seed is an axis of the sweep"):
        runs_of(tmp_path, {**BASE, "runs": {"tiny-review-s0": {"train.seed": 5}}})


def test_hsdp_mesh_must_cover_each_runs_ranks(tmp_path):
    hsdp = {**BASE, "overrides": {"parallel.backend": "fsdp", "parallel.dp_replicate": 2}, "runs": {},
            "sizes": {"rr-60m": {"seeds": 1, "tokens": 10 ** 9, "resources": {"nodes": 2, "gpus_per_node": 8}}}}
    _, _, runs = runs_of(tmp_path, hsdp)
    assert runs[0].resources.world_size == 16 and runs[0].config["parallel"]["dp_replicate"] == 2
    hsdp["sizes"]["tiny"] = {"seeds": 1, "tokens": 40960}  # one GPU cannot hold two replicas
    with pytest.raises(UsageError, match=r"run tiny-review-s0: parallel.dp_shard \(None\) x parallel.dp_replicate "
                                         r"\(2\) must equal the world size \(1\)"):
        runs_of(tmp_path, hsdp)


def test_record_merge_adds_runs_and_refuses_changes(tmp_path):
    sweep, out, runs = runs_of(tmp_path)
    rec = record.merge(None, sweep, runs)
    record.save(out, rec)
    assert set(record.load(out).runs) == {r.id for r in runs}
    # more seeds: only adds runs, the old ones are unchanged
    more = {**BASE, "sizes": {**BASE["sizes"], "tiny": {**BASE["sizes"]["tiny"], "seeds": 3}}}
    sweep2, _, runs2 = runs_of(tmp_path, more)
    rec2 = record.merge(rec, sweep2, runs2)
    assert set(rec2.runs) - set(rec.runs) == {"tiny-review-s2", "tiny-highway-s2", "tiny-standard-s2"}
    # a changed budget alters existing runs: refused, listing the differences
    changed = {**BASE, "sizes": {**BASE["sizes"], "tiny": {**BASE["sizes"]["tiny"], "tokens": 81920}}}
    sweep3, _, runs3 = runs_of(tmp_path, changed)
    with pytest.raises(UsageError) as err:
        record.merge(rec, sweep3, runs3)
    assert "tiny-review-s0: train.tokens: 40960 -> 81920" in str(err.value)
    assert "(and 3 more runs)" in str(err.value)
    with pytest.raises(UsageError, match="holds sweep 't', not 'other'"):
        record.merge(rec, load(tmp_path, {**BASE, "name": "other"}), runs)


@pytest.mark.parametrize("body, out, message", [
    ({**BASE, "name": "a;rm -rf ~"}, "out", "sweep name 'a;rm -rf ~' has characters that are unsafe"),
    (BASE, "my sweep", "sweep directory"),
    (BASE, "o$(id)", "sweep directory"),
])
def test_unsafe_names_refused(tmp_path, body, out, message):
    sweep = load(tmp_path, body)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace("$", r"\$")):
        expand(sweep, tmp_path / out, data_path(sweep, tmp_path / out))


def test_rendered_scripts_pass_bash_n_and_quote(tmp_path):
    sweep, out, runs = runs_of(tmp_path, {**BASE, "sizes": {**BASE["sizes"], "rr-1b": {
        "seeds": 1, "tokens": 10 ** 9, "resources": {"nodes": 2, "gpus_per_node": 8, "partition": "gpu",
                                                      "extra_sbatch": ["--exclusive"]}}}})
    configs = {r.id: out / "configs" / f"{r.id}.yaml" for r in runs}
    for r in runs:
        configs[r.id].parent.mkdir(parents=True, exist_ok=True)
        configs[r.id].write_text(yaml.safe_dump(r.config))
    (out / "code").mkdir()
    scripts = render(out, "t", runs, "/usr/bin/python3", str(out / "code"), configs)
    assert [Path(s["script"]).name for s in scripts] == [
        "array-tiny.sbatch", "array-rr-60m.sbatch", "multinode-rr-1b-review-s0.sbatch",
        "multinode-rr-1b-highway-s0.sbatch", "multinode-rr-1b-standard-s0.sbatch"]
    for s in scripts:
        subprocess.run(["bash", "-n", s["script"]], check=True)
    tiny = Path(scripts[0]["script"]).read_text()
    assert "#SBATCH --array=0-5%5" not in tiny and "#SBATCH --array=0-5%6" in tiny
    assert "#SBATCH --signal=B:USR2@120" in tiny and "#SBATCH --requeue" in tiny
    rows = tiny.split("ROWS=$(cat <<'RRTRAIN_ROWS_END'\n", 1)[1].split("\nRRTRAIN_ROWS_END\n", 1)[0].splitlines()
    assert len(rows) == 6 and rows[0].split("\t")[0] == "tiny-review-s0"  # in the script Slurm keeps, not a file
    assert not list((out / "slurm").glob("*.manifest"))
    multi = Path(scripts[2]["script"]).read_text()
    assert "#SBATCH --nodes=2" in multi and "#SBATCH --partition=gpu" in multi and "#SBATCH --exclusive" in multi
    assert "GPUS_PER_NODE=8" in multi and 'srun --wait="$STEP_GRACE_S"' in multi
    # each multi-node run's rendezvous is drawn at submission, into a file only the user can read
    drawn = [rendezvous.read(rendezvous_path(out, r.id)) for r in runs if r.size == "rr-1b"]
    assert len({d.id for d in drawn}) == 3
    assert f'RDZV_FILE="${{RRTRAIN_RDZV_FILE:-{rendezvous_path(out, "rr-1b-review-s0")}}}"' in multi
    assert "SLURM_JOB_ID % 10000" not in multi and not any(d.id in multi for d in drawn)
    with pytest.raises(UsageError, match="python path"):
        render(out, "t", runs, "/opt/my python/bin/python", str(out / "code"), configs)


def test_templates_pass_bash_n():
    root = REPO / "slurm"
    for name in ("array.sbatch", "multinode.sbatch"):
        subprocess.run(["bash", "-n", str(root / name)], check=True)


def test_submitit_parameters_render_a_valid_job(tmp_path, monkeypatch):
    """The slurm executor's settings as submitit writes them. Rendering needs no Slurm, but submitit's
    SlurmExecutor refuses to be built where `srun` is not on PATH (its `affinity`): on a machine where the
    local cluster of tests/slurm has not been installed yet, the test tells it Slurm is there."""
    import submitit
    from submitit.slurm.slurm import SlurmExecutor

    from launchers.executors.slurm import parameters

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))

    r = spec.Resources(tasks_per_node=2, partition="debug", extra_sbatch=["--exclusive", "--gres=gpu:0"],
                       signal_delay_s=45, max_requeues=7)
    ex = submitit.AutoExecutor(folder=str(tmp_path / "%j"), cluster="slurm", slurm_max_num_timeout=r.max_requeues)
    ex.update_parameters(**parameters(r, "demo-tiny", "/snap/code"))
    text = ex._executor._make_submission_file_text("python -m x", "uid")
    for line in ("#SBATCH --ntasks-per-node=2", "#SBATCH --requeue", "#SBATCH --signal=USR2@45",
                 "#SBATCH --exclusive", "#SBATCH --gres=gpu:0", "#SBATCH --partition=debug",
                 "#SBATCH --open-mode=append", "export PYTHONPATH=/snap/code${PYTHONPATH:+:$PYTHONPATH}"):
        assert line in text
    assert "gpus-per-node" not in text and ex._executor.max_num_timeout == 7
    script = tmp_path / "job.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("present, named", [((), "sbatch and srun"), (("sbatch",), "srun"), (("srun",), "sbatch")])
def test_slurm_executor_without_slurm_names_what_is_missing(tmp_path, monkeypatch, present, named):
    """A login node without Slurm's commands gets one line naming them, before submitit is asked (it would
    raise its own RuntimeError for a missing srun, a traceback for the user)."""
    from launchers.executors.slurm import submit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in present:
        (bin_dir / cmd).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / cmd).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(UsageError, match=f"--executor slurm: {named} not on PATH"):
        submit([], tmp_path / "sweep", "s", str(tmp_path))


@pytest.mark.slow
def test_dry_run_sizes_models_at_the_data_vocabulary(tmp_path, stories_data):
    """The estimate counts parameters at the vocabulary the run will have: the manifest's where `data` is prepared,
    the sweep's `prep:` tokenizer's before it has run; the preset's 50,257 only where neither says; the run's
    recorded config leaves model.vocab_size to the data."""
    import json

    body = {"name": "t", "config": "tiny.yaml", "variants": ["review"], "sizes": {"tiny": {"seeds": 1, "tokens": 40960}}}
    vocab = json.loads((stories_data / "manifest.json").read_text())["vocab_size"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    [prepared] = runs_of(tmp_path / "a", {**body, "data": str(stories_data)})[2]
    [to_prep] = runs_of(tmp_path / "b", {**body, "prep": {"source": "synthetic:stories", "tokenizer": "bpe:1000"}})[2]
    [unknown] = runs_of(tmp_path, {**body, "data": "/data/x"})[2]
    assert prepared.resolved.shape.vocab_size == vocab != 50257
    assert to_prep.resolved.shape.vocab_size == 1000 and to_prep.config["model"]["vocab_size"] is None
    assert unknown.resolved.shape.vocab_size == 50257
    assert prepared.resolved.params < unknown.resolved.params

"""Sweep files: schema errors are one line naming the key (exit 2 from the CLI); shipped sweeps load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launchers.sweep import spec
from launchers.sweep.expand import data_path, expand
from rrtrain.core.errors import UsageError
from trainutil import REPO

BASE = {"name": "t", "config": "tiny.yaml", "data": "/data/x", "variants": ["review", "standard"],
        "sizes": {"tiny": {"seeds": 2, "overrides": {"train.max_steps": 5}}}}


def write(tmp_path: Path, body: dict) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(body, sort_keys=False))
    return p


def with_(**changes) -> dict:
    return {**BASE, **changes}


@pytest.mark.parametrize("body, message", [
    (with_(variantz=["review"]), "unknown key 'variantz'; did you mean 'variants'?"),
    (with_(sizes={"tiny": {"seed": 2}}), "unknown key 'sizes.tiny.seed'; did you mean 'sizes.tiny.seeds'?"),
    (with_(resources={"gpus_per_nod": 1}), "did you mean 'resources.gpus_per_node'?"),
    (with_(sizes={"rr-6m": 1}), "unknown size preset 'rr-6m' (did you mean 'rr-60m'?)"),
    (with_(variants=["reveiw"]), "unknown residual rule 'reveiw' (did you mean 'review'?)"),
    (with_(match="hihgway"), "unknown residual rule 'hihgway'"),
    (with_(sizes={"tiny": {"seeds": 0}}), "sizes.tiny.seeds must be at least 1, got 0"),
    (with_(resources={"nodes": 0}), "resources.nodes must be at least 1"),
    (with_(resources={"gpus_per_node": 8, "tasks_per_node": 4}), "runs take one task per GPU"),
    (with_(resources={"time_min": 1, "signal_delay_s": 120}), "is not shorter than time_min"),
    (with_(sizes={"tiny": {"seeds": 1, "resources": {"mem_gb": 0}}}), "sizes.tiny.resources.mem_gb must be positive"),
    (with_(resources={"extra_sbatch": ["exclusive"]}), "is not one sbatch option"),
    (with_(config="nope.yaml"), "no training config 'nope.yaml'"),
    (with_(variants=[]), "'variants' is empty"),
    (with_(mfu=1.5), "mfu must be in (0, 1]"),
])
def test_schema_errors(tmp_path, body, message):
    with pytest.raises(UsageError) as err:
        spec.load(write(tmp_path, body))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_training_key_names_the_run(tmp_path):
    sweep = spec.load(write(tmp_path, with_(overrides={"train.max_stpes": 3})))
    with pytest.raises(UsageError, match=r"run tiny-review-s0: unknown key 'train.max_stpes'; did you mean"):
        expand(sweep, tmp_path / "out", data_path(sweep, tmp_path / "out"))


def test_cli_exit_2_one_line(tmp_path, capsys):
    """`rrtrain sweep` in this process (the command's main)."""
    from rrtrain.cli.main import main

    p = write(tmp_path, with_(sizes={"tiny": {"seeds": -1}}))
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == "rrtrain sweep: error: sizes.tiny.seeds must be at least 1, got -1"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs" / "sweeps").glob("*.yaml")))
def test_shipped_sweeps_expand(tmp_path, name):
    sweep = spec.load(REPO / "configs" / "sweeps" / name)
    runs = expand(sweep, tmp_path / "out", data_path(sweep, tmp_path / "out"))
    assert len({r.id for r in runs}) == len(runs)
    if name == "tuned.yaml":  # 3 variants x 2 sizes x 3 learning rates x 3 seeds
        assert len(runs) == 54 and {r.point["train.lr"] for r in runs} == {3e-3, 1e-2, 3e-2}
    if name == "paper.yaml":
        seeds = {s: len({r.seed for r in runs if r.size == s}) for s in sweep.size_specs}
        assert seeds == {"rr-60m": 3, "rr-150m": 3, "rr-320m": 2, "rr-590m": 3, "rr-1b": 3}
        assert {r.variant for r in runs} == {"review", "highway", "standard"}
        assert len(runs) == 3 * (3 + 3 + 2 + 3 + 3)
        for size in sweep.size_specs:  # the same token budget for every variant of a size
            assert len({r.config["train"]["tokens"] for r in runs if r.size == size}) == 1
        assert all(r.config["match"]["reference"] == "review" for r in runs)


def test_command_line_overrides_of_sweep_keys(tmp_path):
    p = write(tmp_path, BASE)
    plain = spec.load(p)
    over = spec.load(p, ["resources.partition=debug", "sizes.tiny.seeds=3"])
    assert over.spec.resources.partition == "debug" and over.size_specs["tiny"].seeds == 3
    assert over.sha256 != plain.sha256  # the record tells the two apart
    with pytest.raises(UsageError, match="did you mean 'resources.partition'"):
        spec.load(p, ["resources.partitoin=debug"])


def test_a_prep_section_passes_bos_to_rrtrain_prep(tmp_path, capsys):
    from launchers.submit import prepare_data

    body = {k: v for k, v in BASE.items() if k != "data"}
    sweep = spec.load(write(tmp_path, {**body, "prep": {"tokenizer": "bpe:512", "bos": True}}))
    prepare_data(sweep, tmp_path / "out", dry_run=True)
    line = capsys.readouterr().out
    assert "--bos" in line.split() and "--bos-token" not in line, line
    sweep = spec.load(write(tmp_path, {**body, "prep": {"tokenizer": "bpe:512"}}))
    prepare_data(sweep, tmp_path / "out", dry_run=True)
    assert "--bos" not in capsys.readouterr().out.split()


def test_a_prep_section_with_tasks_tokenizes_in_array_tasks_of_the_sweeps_executor(tmp_path, capsys):
    from launchers.submit import prepare_data

    body = {k: v for k, v in BASE.items() if k != "data"}
    sweep = spec.load(write(tmp_path, {**body, "prep": {"tasks": 3}}), ["resources.partition=cpu"])
    prepare_data(sweep, tmp_path / "out", dry_run=True, executor="slurm")
    words = capsys.readouterr().out.split()
    assert words[words.index("--executor") + 1] == "slurm" and words[words.index("--tasks") + 1] == "3"
    assert words[words.index("--partition") + 1] == "cpu"
    prepare_data(sweep, tmp_path / "out", dry_run=True, executor="local")
    words = capsys.readouterr().out.split()
    assert words[words.index("--executor") + 1] == "local" and "--partition" not in words
    prepare_data(spec.load(write(tmp_path, {**body, "prep": {}})), tmp_path / "out", dry_run=True, executor="slurm")
    assert "--tasks" not in capsys.readouterr().out.split()  # one process, as before
    with pytest.raises(UsageError, match="prep.tasks must be at least 1, got 0"):
        spec.load(write(tmp_path, {**body, "prep": {"tasks": 0}}))

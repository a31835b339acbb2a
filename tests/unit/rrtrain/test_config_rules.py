"""One source per rule: the per-key rules live on the config's fields, each default is written once.

The metadata functions must give exactly the sets that were constants before (checkpoint's FREE / LAYOUT /
NEVER, the sweep's AXES and NOT_SETTING), and a rule written on a field must be what `check_resume` does.
`rrtrain plan`'s Setup holds the run's parallel section; prep's parser and prep commands read PrepOptions.
"""

from __future__ import annotations

import dataclasses

import pytest

from data_prep import options as prep_options
from data_prep.cli import build_parser, options_from_args
from data_prep.options import PrepOptions, command
from rrtrain import config
from rrtrain.cli import plan as plan_cli
from rrtrain.config import Config, ModelConfig, ParallelConfig, TrainConfig
from rrtrain.core.child_python import module_argv
from rrtrain.core.errors import UsageError
from rrtrain.parallel import memory as planner
from rrtrain.config_load import dotted_keys
from rrtrain.training.checkpoint import check_resume

# the constants as they were written before the rules moved onto the fields
OLD_FREE = {
    "run.name", "train.log_every", "train.eval_every", "train.ckpt_every", "train.keep_ckpts", "train.diag_every",
    "train.allow_config_change", "train.fail_at_step", "train.fail_steps", "parallel.ac", "parallel.ac_every",
    "parallel.timeout_s", "parallel.reshard_after_forward", "train.compile", "data.num_workers", "data.cache_dir",
    "run.dir", "run.lock_wait_s", "train.ckpt_async", "train.allow_unverified_checkpoint", "train.callbacks",
    *(f"monitor.{k}" for k in ("min_steps", "window", "min_improvement", "entropy_margin", "grad_ratio",
                               "spike_sigma", "spike_patience", "on_stall", "on_diverge", "heartbeat_s", "peer_mad")),
    "log.wandb", "log.wandb.project", "log.wandb.entity", "log.wandb.mode", "log.wandb.group",
    *(f"eval.downstream.{k}" for k in ("tasks", "every", "limit", "num_fewshot", "include", "batch_size")),
    "train.artifact_every", "init.from_",  # issue 46: the artifact's cadence; a warm start (a resume loads its own)
}
OLD_LAYOUT = {"parallel.dp_shard", "parallel.dp_replicate"}  # and world_size, which is not a config key
# data.sources: data.path's mixture form; train.branch_from: a cooldown branch's parent, which a run keeps
OLD_NEVER = {"data.path", "data.sources", "train.seed", "parallel.backend", "train.branch_from"}
OLD_NEVER_PREFIXES = ("model.", "match.")
OLD_AXES = ("model.size", "model.variant", "train.seed", "run.dir")  # launchers/expand.py
OLD_NOT_SETTING = ("train.seed", "run.dir", "run.name")  # the pruning pass's own tuple before the rule moved onto the fields
OLD_GRID_FORBIDDEN = ("model.size", "model.variant", "train.seed", "run.dir", "run.name", "run.point")  # the sweep file's own tuple, likewise


def old_rule(key: str) -> str:
    if key in OLD_FREE:
        return "free"
    if key in OLD_NEVER or key.startswith(OLD_NEVER_PREFIXES):
        return "never"
    return "layout" if key in OLD_LAYOUT else "consent"


def test_resume_sets_are_the_old_constants() -> None:
    assert config.keys_with_resume("free") == OLD_FREE
    assert config.keys_with_resume("layout") == OLD_LAYOUT
    never = config.keys_with_resume("never")
    assert OLD_NEVER <= never and all(k in OLD_NEVER or k.startswith(OLD_NEVER_PREFIXES) for k in never)
    assert "model.residual" in never  # the rules' knobs: one free-form key, never changed on resume
    assert config.resume_rule("model.residual.gate_rank") == config.resume_rule("model.residual.anything") == "never"
    with pytest.raises(ValueError, match="resume rule"):
        config.keys_with_resume("sometimes")


def keys_to_try() -> list[str]:
    """Every schema key, every key of a full config (grid point and W&B set), and keys the schema does not know."""
    cfg = Config()
    cfg.run.point = {"train.lr": 0.003}
    cfg.log.wandb = config.WandbConfig(project="p")
    cfg.model.residual = {"gate_rank": 4}
    unknown = ["train.gone", "monitor.gone", "log.wandb.gone", "model.residual.gone", "match.gone", "nosuch",
               "eval.downstream.gone", "run.point.model.size", "parallel.ac.deeper"]
    return sorted(set(config.schema_keys()) | set(dotted_keys(cfg.to_dict())) | set(unknown))


@pytest.mark.parametrize("key", keys_to_try())
def test_every_key_resumes_as_before(key: str) -> None:
    assert config.resume_rule(key) == old_rule(key)


def test_sweep_axes_and_settings_are_the_old_constants() -> None:
    axes = config.sweep_axes()
    not_setting = tuple(k for k, r in config.schema_keys().items() if not r["setting"] and not r["free_form"])
    assert sorted(axes) == sorted(OLD_AXES) and len(set(axes)) == len(axes)
    assert sorted(not_setting) == sorted(OLD_NOT_SETTING) and len(set(not_setting)) == len(not_setting)
    assert sorted(config.keys_a_grid_may_not_move()) == sorted(OLD_GRID_FORBIDDEN)
    for key in keys_to_try():  # the prune pass's old test, key by key (`run.point` alone is never a flattened key:
        if key == "run.point":  # an empty mapping flattens to nothing; the label it is, is not a setting)
            assert not config.is_setting(key)
            continue
        assert config.is_setting(key) == (key not in OLD_NOT_SETTING and not key.startswith("run.point.")), key


def field_of(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def test_a_rule_written_on_a_field_is_what_resume_does(monkeypatch: pytest.MonkeyPatch) -> None:
    before, after = Config().to_dict(), Config().to_dict()
    after["train"]["lr"] = 1e-3
    with pytest.raises(UsageError, match="allow_config_change"):  # no rule on the field: consent
        check_resume(before, after, 1, 1, allow=False)
    lr = field_of(TrainConfig, "lr")
    monkeypatch.setattr(lr, "metadata", config.FREE)
    assert check_resume(before, after, 1, 1, allow=False) == []
    monkeypatch.setattr(lr, "metadata", config.LAYOUT)
    assert check_resume(before, after, 1, 1, allow=False) == ["train.lr: 0.0003 -> 0.001"]
    monkeypatch.setattr(lr, "metadata", config.NEVER)
    with pytest.raises(UsageError, match="use a new run.dir"):
        check_resume(before, after, 1, 1, allow=True)


def test_a_section_rule_covers_its_keys_and_a_field_below_may_say_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config.resume_rule("model.d_model") == "never" and config.key_rules("model.size")["axis"]
    monkeypatch.setattr(field_of(ModelConfig, "norm_eps"), "metadata", config.FREE)
    assert config.resume_rule("model.norm_eps") == "free" and config.resume_rule("model.init_std") == "never"


def test_the_planner_checks_against_the_configs_choices() -> None:
    assert planner.BACKENDS == config.choices(ParallelConfig, "backend")
    assert planner.PRECISIONS == config.choices(ParallelConfig, "precision")
    assert sorted(planner.AC_MODES) == sorted(config.choices(ParallelConfig, "ac"))
    with pytest.raises(TypeError):
        config.choices(ParallelConfig, "ac_every")


# ---------------------------------------------------------------------------------------------
# plan's Setup holds the run's parallel section


def test_setup_holds_the_parallel_section() -> None:
    m = ModelConfig(size="tiny")
    s = planner.Setup(m, gpus=8)
    assert isinstance(s.parallel, ParallelConfig)
    assert (s.backend, s.precision, s.gpu, s.mfu) == ("fsdp", "bf16", config.DEFAULT_GPU, config.DEFAULT_MFU)
    full = planner.Setup(m, gpus=8, ac="full", zero_stage=3)
    assert (full.parallel.ac, full.ac, full.zero_stage) == ("full", "full", 3)
    assert dataclasses.replace(full, ac="selective", micro_batch=2).parallel.ac == "selective"
    assert dataclasses.replace(full, micro_batch=2).parallel == full.parallel
    given = ParallelConfig(backend="deepspeed", zero_stage=1)
    assert planner.Setup(m, gpus=8, parallel=given, ac="full").parallel == ParallelConfig(
        backend="deepspeed", zero_stage=1, ac="full")
    assert given.ac == "none"  # the section given is not changed
    with pytest.raises(TypeError, match="unexpected keyword argument 'acc'"):
        planner.Setup(m, gpus=8, acc="full")


def test_setup_of_run_lays_out_the_run_as_before() -> None:
    from rrtrain.resolve import resolve

    cfg = config.load_config(None, ["model.size=tiny", "parallel.backend=fsdp", "parallel.ac=selective",
                                    "parallel.ac_every=3", "train.global_batch=16", "parallel.precision=fp32",
                                    "parallel.reshard_after_forward=false", "parallel.dp_shard=2"])
    run = resolve(cfg)
    s = planner.Setup.of_run(run, 4, micro_batch=2, tokens=1e9, gpu="a100", mfu=0.5)
    old = planner.Setup(model=cfg.model, run=run, gpus=4, gpu="a100", backend="fsdp", dp_shard=2, zero_stage=2,
                        ac="selective", ac_every=3, micro_batch=2, global_batch=16, tokens=1e9, mfu=0.5,
                        precision="fp32", reshard_after_forward=False)
    fields = ("backend", "dp_shard", "zero_stage", "ac", "ac_every", "precision", "reshard_after_forward",
              "micro_batch", "global_batch", "tokens", "gpu", "mfu", "gpus", "model", "run")
    assert {f: getattr(s, f) for f in fields} == {f: getattr(old, f) for f in fields}
    one = planner.Setup.of_run(run, 1, micro_batch=2, backend="none")
    assert (one.backend, one.dp_shard) == ("none", None)


def test_plan_defaults_are_the_configs() -> None:
    s = plan_cli.setup_from(plan_cli.parse(["--size", "tiny", "--gpus", "8"]))
    assert (s.gpu, s.mfu) == (config.DEFAULT_GPU, config.DEFAULT_MFU)
    assert planner.gpu_spec(config.DEFAULT_GPU)  # a GPU the planner knows


# ---------------------------------------------------------------------------------------------
# prep's defaults: PrepOptions, read by its parser and by whoever builds a prep command


def test_prep_parser_defaults_are_prep_options() -> None:
    parsed = options_from_args(["--source", "s", "--out", "o"])
    assert parsed == PrepOptions(source="s", out="o")
    help_text = build_parser().format_help()
    assert f"(default: {prep_options.default('seq_len')})" in help_text


@pytest.mark.parametrize("opts", [
    PrepOptions(source="synthetic:stories", out="d"),
    PrepOptions(source="c.txt", out="d", tokenizer="bpe:300", seq_len=64, val_fraction=0.1, min_val_samples=4,
                workers=2, num_docs=30, overwrite=True, doc_sep="line", text_field="body", compression="zstd",
                seed=3, shard_size=4096, bpe_sample_docs=10, eos_token="<e>", progress=False),
])
def test_prep_options_round_trip_through_the_command_line(opts: PrepOptions) -> None:
    assert options_from_args(opts.argv()) == opts
    assert command(opts, python="PY") == [*module_argv("rrtrain", "prep", python="PY"), *opts.argv()]


def test_prep_options_given_leave_unset_keys_to_prep() -> None:
    o = PrepOptions.given("synthetic:stories", "d", seq_len=64, val_fraction=None, num_docs=None, seed=None)
    assert o == PrepOptions(source="synthetic:stories", out="d", seq_len=64)
    assert o.argv() == ["--source", "synthetic:stories", "--out", "d", "--seq-len", "64"]
    with pytest.raises(ValueError, match="chunk_docs"):
        PrepOptions(source="s", out="d", chunk_docs=1).argv()

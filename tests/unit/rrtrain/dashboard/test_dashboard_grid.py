"""The dashboard over a sweep with a grid: a run's name carries its point and its HParams session the grid keys."""

from __future__ import annotations

import json

import yaml

from rrtrain.dashboard.tensorboard import build_logdir


def make_run(path, size, variant, seed, point):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"model": {"size": size, "variant": variant},
                                                      "train": {"seed": seed}, "run": {"point": point}}))
    lines = [{"step": s, "loss": 5.0 - 0.1 * s, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64 * s} for s in (1, 2, 3)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def session_hparams(run_dir) -> dict:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    (events,) = run_dir.glob("*/*.rrtrain-dashboard")  # the session: a run of its own, NAME/STATUS
    for event in EventFileLoader(str(events)).Load():
        for value in event.summary.value:
            if value.tag == "_hparams_/session_start_info":
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                return {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                        for k, v in data.session_start_info.hparams.items()}
    return {}


def test_grid_runs_are_named_by_point_and_carry_the_grid_keys(tmp_path):
    sweep = tmp_path / "sweep"
    make_run(sweep / "tiny-review-lr1e-3-s0", "tiny", "review", 0, {"train.lr": 0.001})
    make_run(sweep / "tiny-review-lr3e-3-s0", "tiny", "review", 0, {"train.lr": 0.003})
    make_run(sweep / "tiny-standard-s0", "tiny", "standard", 0, {})
    logdir, names = build_logdir(sweep)
    assert sorted(names) == ["tiny/review/lr1e-3/seed0", "tiny/review/lr3e-3/seed0", "tiny/standard/seed0"]
    hp = session_hparams(logdir / "tiny" / "review" / "lr3e-3" / "seed0")
    assert hp["train.lr"] == 0.003 and hp["variant"] == "review"
    assert "train.lr" not in session_hparams(logdir / "tiny" / "standard" / "seed0")


def test_a_recorded_point_that_could_name_a_path_is_dropped():
    """run.point is read from a run's config.yaml, which anyone may have written: only dotted config keys with
    values that encode in safe characters survive, so a point never names `..`, a slash or a newline."""
    from rrtrain.rundir.points import point_key, read_point

    hostile = {"run": {"point": {"a.": "..", "../x": 1, "train.lr": "1e-3\n", "x/y.z": 2, "train.a/b": 3,
                                 "train.warmup_steps": 10 ** 30, "train.seed_x": [1], "train.lr_min": 0.5}}}
    point = read_point(hostile)
    assert point == {"train.lr_min": 0.5}
    assert point_key(point) == "lr_min0.5"

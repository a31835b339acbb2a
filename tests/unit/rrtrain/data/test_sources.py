"""Weighted mixtures of prepared datasets (`data.sources`): the config's checks, the sources' manifests, the
loader's draw by weight, its exact resume, and recorded paths made absolute."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from prep_helpers import write_id_dataset
from rrtrain.config import DataConfig, load_config
from rrtrain.core.errors import UsageError
from rrtrain.data.loader import TrainLoader
from rrtrain.data.sources import absolute_data, absolute_in_saved, read_mixture, tokenizer_path

#: train rows per source; source k's row ids start at 1000 * k, so batch[:, 0] // 1000 names the source
SIZES = {"a": 300, "b": 90, "c": 500}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sources")
    paths = {}
    for k, (name, n) in enumerate(SIZES.items()):
        paths[name] = str(root / name)
        write_id_dataset(paths[name], n, n_val=20, first_id=1000 * k, shard_size=512)
    return paths


def _data(paths: dict[str, str], weights: dict[str, float]) -> DataConfig:
    return DataConfig(sources=[{"path": paths[n], "weight": w} for n, w in weights.items()])


def _loader(data: DataConfig, tmp_path, **kw) -> TrainLoader:
    args = dict(micro_batch=8, global_batch=8, rank=0, world_size=1, local_rank=0, seed=3, shuffle=data.shuffle)
    args.update(kw)
    return TrainLoader(None, cache_dir=str(tmp_path / "cache"), mixture=read_mixture(data), **args)


def _ids(loader: TrainLoader, batches: int) -> np.ndarray:
    it = iter(loader)
    out = np.concatenate([next(it)[:, 0].numpy() for _ in range(batches)])
    loader.close()
    return out


# -- the config ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sources, message", [
    ([{"path": "a", "weight": 0}], "data.sources[0].weight must be a positive finite number, got 0"),
    ([{"path": "a", "weight": -0.5}], "data.sources[0].weight must be a positive finite number, got -0.5"),
    ([{"path": "a", "weight": True}], "data.sources[0].weight: expected a positive number"),
    ([{"path": "a"}], "data.sources[0].weight is missing"),
    ([{"path": "x/a", "weight": 1}, {"path": "y/a", "weight": 1}], "data.sources[1]: name 'a' is data.sources[0]'s"),
    ([{"path": "a", "weight": 1, "name": "one"}, {"path": "./a", "weight": 1}],
     "data.sources[1]: path './a' is data.sources[0]'s too"),
    ([{"path": "a", "weight": 1, "wieght": 2}], "unknown key 'data.sources[0].wieght'; did you mean 'data.sources[0].weight'?"),
    ([{"path": "a", "weight": 1, "name": "a b"}], "data.sources[0].name: 'a b' is not a source name"),
    ([{"path": "", "weight": 1}], "data.sources[0].path: expected a directory"),
    (["a"], "data.sources[0]: expected a mapping"),
    ([], "data.sources is empty"),
])
def test_bad_sources_are_one_line_errors(sources, message):
    with pytest.raises(UsageError) as err:
        DataConfig(sources=sources)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_path_and_sources_together_are_refused_and_names_default_to_the_directory():
    with pytest.raises(UsageError, match="data.path and data.sources are both set"):
        load_config(None, ["data.path=x", "data.sources=[{path: y, weight: 1}]"])
    cfg = load_config(None, ["data.sources=[{path: corpora/web/, weight: 3}, {path: s3://b/code, weight: 1, name: c}]"])
    assert cfg.data.sources == [{"path": "corpora/web/", "weight": 3.0, "name": "web"},
                                {"path": "s3://b/code", "weight": 1.0, "name": "c"}]
    assert tokenizer_path(cfg.data) == "corpora/web/"
    assert load_config(None, []).data.sources is None  # unset: what a run recorded before mixtures existed


def test_recorded_paths_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one = absolute_data(DataConfig(path="data/x"))
    assert one.path == str(tmp_path / "data" / "x")
    mix = absolute_data(DataConfig(sources=[{"path": "a", "weight": 1}, {"path": "gs://b/c", "weight": 2}]))
    assert [s["path"] for s in mix.sources] == [str(tmp_path / "a"), "gs://b/c"]
    assert [s["name"] for s in mix.sources] == ["a", "c"]
    # a checkpoint that recorded a relative path compares as this folder's absolute path
    assert absolute_in_saved({"data": {"path": "data/x"}, "run": {}}) == {"data": {"path": one.path}, "run": {}}


# -- the sources' manifests ---------------------------------------------------------------------------------------


def test_missing_source_and_different_tokenizers_or_seq_len_are_refused(sources, tmp_path):
    with pytest.raises(UsageError, match=r"^data.sources\[1\] \(gone\): no manifest.json in"):
        read_mixture(DataConfig(sources=[{"path": sources["a"], "weight": 1},
                                         {"path": str(tmp_path / "gone"), "weight": 1}]))
    other = tmp_path / "other"
    shutil.copytree(sources["b"], other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "tokenizer": "gpt2", "tokenizer_hash": "f00"}))
    with pytest.raises(UsageError) as err:
        read_mixture(DataConfig(sources=[{"path": sources["a"], "weight": 1}, {"path": str(other), "weight": 1}]))
    assert str(err.value).startswith("data.sources: 'a' and 'other' were prepared with different tokenizers")
    (other / "manifest.json").write_text(json.dumps({**manifest, "seq_len": 15}))
    with pytest.raises(UsageError, match="'a' and 'other' were packed with different seq_len \\(7 vs 15\\)"):
        read_mixture(DataConfig(sources=[{"path": sources["a"], "weight": 1}, {"path": str(other), "weight": 1}]))


# -- the loader ---------------------------------------------------------------------------------------------------


def test_weights_are_honoured_within_sampling_error(sources, tmp_path):
    weights = {"a": 1.0, "b": 2.0, "c": 1.0}  # b is the smallest source and the heaviest: it repeats
    ids = _ids(_loader(_data(sources, weights), tmp_path), 500)  # 4,000 samples, 4.5 epochs of 890
    counts = np.bincount(ids // 1000, minlength=3)
    total = sum(weights.values())
    for k, w in enumerate(weights.values()):
        p = w / total
        assert abs(counts[k] / len(ids) - p) < 4 * math.sqrt(p * (1 - p) / len(ids)), (k, counts)
    within = ids % 1000  # no row outside its source; the source drawn 4.9 times an epoch shows every row
    for k, n in enumerate(SIZES.values()):
        assert within[ids // 1000 == k].max() < n
    assert len(np.unique(within[ids // 1000 == 1])) == SIZES["b"]


def test_other_weights_other_draw_and_the_seed_decides_the_order(sources, tmp_path):
    even = _ids(_loader(_data(sources, {"a": 1, "b": 1, "c": 1}), tmp_path), 60)
    assert abs(np.mean(even // 1000 == 1) - 1 / 3) < 0.06
    again = _ids(_loader(_data(sources, {"a": 1, "b": 1, "c": 1}), tmp_path), 60)
    assert np.array_equal(even, again)
    assert not np.array_equal(even, _ids(_loader(_data(sources, {"a": 1, "b": 1, "c": 1}), tmp_path, seed=4), 60))


def test_mixture_resumes_exactly_at_any_position_and_refuses_other_weights(sources, tmp_path):
    data = _data(sources, {"a": 3, "b": 1, "c": 1})
    full = _loader(data, tmp_path, micro_batch=4, global_batch=8)
    it = iter(full)
    steps, states = [], {}
    for step in range(1, 271):  # the epoch is 890 samples: steps 111/112 straddle it, 222/223 the next
        steps.append(np.concatenate([next(it)[:, 0].numpy(), next(it)[:, 0].numpy()]))
        states[step] = full.state_dict()
    full.close()
    for at in (5, 111, 223):
        resumed = _loader(data, tmp_path, micro_batch=2, global_batch=8)  # another micro-batch: same step sets
        resumed.load_state_dict(states[at])
        got = _ids(resumed, 4 * 40)
        want = np.concatenate(steps[at:at + 40])
        assert np.array_equal(np.sort(got.reshape(40, 8), axis=1), np.sort(want.reshape(40, 8), axis=1)), at
    other = _loader(_data(sources, {"a": 1, "b": 1, "c": 1}), tmp_path, micro_batch=4, global_batch=8)
    with pytest.raises(UsageError, match="cannot resume the data loader: fingerprint"):
        other.load_state_dict(states[5])


def test_a_mixture_of_one_reads_as_data_path_does(sources, tmp_path):
    plain = TrainLoader(sources["c"], micro_batch=8, global_batch=8, rank=0, world_size=1, local_rank=0, seed=3,
                        cache_dir=str(tmp_path / "plain"))
    one = _loader(DataConfig(sources=[{"path": sources["c"], "weight": 0.25}]), tmp_path)
    assert np.array_equal(_ids(plain, 130), _ids(one, 130))  # two epochs of 500 and more


def test_compressed_sources_are_read_through_the_runs_cache(sources, tmp_path):
    zipped = str(tmp_path / "z")
    write_id_dataset(zipped, 40, n_val=20, first_id=3000, compression="zstd")
    data = DataConfig(sources=[{"path": sources["a"], "weight": 1}, {"path": zipped, "weight": 1}])
    ids = _ids(_loader(data, tmp_path), 40)
    assert set(np.unique(ids // 1000)) == {0, 3}
    unzipped = sorted((tmp_path / "cache" / "loader").glob("*/rrtrain-unzipped/train/*"))
    assert unzipped and {p.parents[2].name for p in unzipped} == {"1-z"}  # only the compressed source's shards


def test_a_missing_source_is_refused_before_the_run_directory_is_made(sources, tmp_path):
    from rrtrain.train import run

    cfg = load_config(None, [f"run.dir={tmp_path / 'run'}",
                             f"data.sources=[{{path: {sources['a']}, weight: 1}}, {{path: {tmp_path / 'gone'}, weight: 1}}]"])
    with pytest.raises(UsageError, match=r"data.sources\[1\] \(gone\): no manifest.json"):
        run(cfg)
    assert not (tmp_path / "run").exists()


def test_eval_needs_tasks_or_a_dataset():
    from rrtrain.cli.eval import check, parse

    with pytest.raises(UsageError, match="--tasks is needed \\(or --data DIR"):
        check(parse(["RUN"]))
    check(parse(["RUN", "--data", "DIR"]))
    check(parse(["RUN", "--tasks", "piqa"]))

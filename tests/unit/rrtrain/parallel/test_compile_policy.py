"""`train.compile`: what "auto" decides (docs/performance.md, "Compile") and the eager fallback with its one line."""

from __future__ import annotations

import pytest
import torch

from rrtrain.parallel.compile_policy import (AUTO_MIN_STEPS, AUTO_MIN_STEPS_CPU, auto_compiles, resolve_compile,
                                    unavailable_reason)
from rrtrain.config import load_config

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("steps", [1, 300, 2000, AUTO_MIN_STEPS_CPU - 1])
def test_auto_stays_eager_for_cpu_runs_shorter_than_the_threshold(steps):
    """Tests, the demo and the benchmarks' 2,000-step runs stay eager on CPU (docs/performance.md, "Compile")."""
    assert auto_compiles(CPU, steps) is False
    assert resolve_compile("auto", CPU, steps) is False


def test_auto_compiles_long_runs():
    assert AUTO_MIN_STEPS_CPU == 10_000 and AUTO_MIN_STEPS == 1000
    assert auto_compiles(CPU, AUTO_MIN_STEPS_CPU) is True
    assert auto_compiles(CUDA, AUTO_MIN_STEPS) is True
    assert auto_compiles(CUDA, AUTO_MIN_STEPS - 1) is False


def test_the_shipped_configs_stay_eager_on_cpu():
    """The tiny config (tests, `rrtrain demo`) resolves to eager on a CPU run of its length."""
    cfg = load_config("configs/train/tiny.yaml", [])
    assert cfg.train.compile == "auto"
    assert resolve_compile(cfg.train.compile, CPU, cfg.train.max_steps) is False


def test_no_compiler_runs_eagerly_and_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no g++, c++ or clang++ to be found
    assert unavailable_reason(CPU) == "no C++ compiler on PATH"
    assert resolve_compile(True, CPU, 10) is False
    out = capsys.readouterr().out
    assert out == "rrtrain: train.compile: no C++ compiler on PATH; running eagerly\n"
    assert resolve_compile("auto", CPU, AUTO_MIN_STEPS_CPU) is False  # "auto" falls back the same way
    assert capsys.readouterr().out == "rrtrain: train.compile: no C++ compiler on PATH; running eagerly\n"
    assert resolve_compile(True, CPU, 10, announce=False) is False
    assert capsys.readouterr().out == ""


def test_true_compiles_and_false_does_not_where_a_compiler_exists():
    if unavailable_reason(CPU) is not None:
        pytest.skip(f"compilation unavailable here: {unavailable_reason(CPU)}")
    assert resolve_compile(True, CPU, 1) is True
    assert resolve_compile(False, CPU, 10**6) is False

"""The console lines a person running `rrtrain train` reads (rrtrain.training.console)."""

from __future__ import annotations

from rrtrain.training.console import duration, progress_line


def test_durations_are_short():
    assert [duration(s) for s in (0, 42.4, 185, 7620, -3)] == ["0s", "42s", "3m05s", "2h07m", "0s"]


def test_a_progress_line_has_every_field_and_val_only_when_fresh():
    rec = {"step": 120, "loss": 3.01234, "lr": 8.2e-4, "grad_norm": 0.5123, "tokens_per_s": 12345.6, "mfu": 0.3123,
           "mem_gb": 1.1}
    line = progress_line(rec, 1000, 3.0456, elapsed=62, eta=490)
    assert line == ("rrtrain: step 120/1000 | loss 3.0123 | val 3.0456 | lr 8.20e-04 | gnorm 0.512 | tok/s 12,346 | "
                    "mfu 31.23% | mem 1.10GB | elapsed 1m02s | eta 8m10s")
    bare = progress_line({"step": 3, "loss": None, "lr": 1e-3, "grad_norm": float("nan")}, 10, None, 5, None)
    assert bare == "rrtrain: step 3/10 | loss nan | lr 1.00e-03 | gnorm nan | elapsed 5s"

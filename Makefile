# Two commands from a fresh clone: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench install clean

# tools/install.py installs with uv, from the indexes pip is configured with (pip alone where uv is not to be had)
$(STAMP): pyproject.toml tools/install.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) tools/install.py -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rrtrain demo --out runs/demo

# Four workers on two cores: the Slurm tests stay together on one (tests/conftest.py), which mostly waits on the
# scheduler and the daemons, and so do the tests that wait on a signal, a browser or a rendezvous. Both tiers
# cache the bytecode of what they import (rrtrain's modules, pytest's rewritten test files) whatever
# PYTHONDONTWRITEBYTECODE says: every worker and process would compile them again (~7 CPU-s a worker's collection).
test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -n 4 --dist loadgroup --durations=20

# The edit loop's tier: tests/unit without the `slow` mark, on two workers, 3 minutes on two cores by budget (DEVELOPERS.md has the last measurement). It
# starts no training subprocess, torchrun, browser or cluster: tests/tiers.py fails a test that does.
test-fast: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE RRTRAIN_TEST_TIER=fast $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup -m "not slow" --durations=10 tests/unit

bench: $(STAMP)
	$(PY) -m pytest -q -s -p no:cacheprovider tests/benchmarks

clean:
	rm -rf runs build *.egg-info

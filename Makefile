# Two commands from a fresh clone: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rrtrain demo --out runs/demo

# Two workers: most tests run one single-threaded process; the Slurm tests stay together on one (tests/conftest.py).
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --durations=20

bench: $(STAMP)
	$(PY) -m pytest -q -s -p no:cacheprovider tests/benchmarks

clean:
	rm -rf runs build *.egg-info

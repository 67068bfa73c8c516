# Every target sets up .venv/ itself: torch's CPU build first (an unpinned torch
# would pull a multi-GB CUDA build), then the package with every extra.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.somatize-installed

.PHONY: setup demo test faults lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(PY) recipes/digits.py

test: setup
	$(PY) -m pytest -q

# many more trials of the fault-injection suite (make test runs a few of each)
FAULT_TRIALS ?= 40
faults: setup
	SOMATIZE_FAULT_TRIALS=$(FAULT_TRIALS) $(PY) -m pytest -q -m faults tests/faults

lint: setup
	$(PY) -m ruff check somatize tests recipes benchmarks tools
	$(PY) -m ruff format --check somatize tests recipes benchmarks tools
	$(PY) -m mypy

bench: setup
	# Flower only to compare against, never a dependency of somatize (bench_federated says when it is missing)
	$(PY) -m pip install --quiet "flwr[simulation]" || echo "flwr[simulation] not installed: the Flower rows are skipped"
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info

# The two commands of the README:  `make demo`  and  `make test`.
# Both create a virtual environment in .venv on first use and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-integration bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,mpi,flower,torch]"
	touch $@

## make demo: Fed-mv-PPCA on the bundled Alzheimer data (3 sites, G/K); report in fedhier-report/
demo: $(VENV)/.installed-core
	$(BIN)/fedhier demo

## make test: the whole default test suite (pytest exits non-zero, including 5 = no tests)
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest

## make test-integration: the tests that start real SuperLinks, SuperNodes and MPI jobs on loopback (CI's second step)
test-integration: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "integration and not slow"

## make bench: the benchmarks quoted in the README
bench: $(VENV)/.installed-test
	OPENBLAS_NUM_THREADS=1 $(BIN)/python benchmarks/bench_mvppca.py
	OPENBLAS_NUM_THREADS=1 $(BIN)/python benchmarks/bench_fedlin.py

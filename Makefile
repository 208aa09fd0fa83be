# make demo: set up .venv (a Python >= 3.12 found on PATH or under pyenv) with the `train` extra and run the main
#            job: a Hydra sweep of softmax, a sliding window, power and a hybrid on a near and a far MQAR cell (CPU,
#            about 9 minutes on 2 idle cores), then its table and the TensorBoard command.
# make test: .venv with the `test` extra (`train` and the test tools; no torch, no lm-eval), then the quick tier of
#            the library's tests: ops, kernels, modules, generation, data, the trainer's parts in process, on their
#            quick cases (within 15 minutes on 2 cores; PERF_LOG, "the suite's time"). Left out: further cases
#            (marked slow) and the integration tests (marked integration: trainer runs, the 8-device files, the
#            wheel, the serving layer, the experiments, transformers' models and lm-eval).
# make test-integration: .venv with the `integration` extra (`test`, lm-eval and torch), then the integration
#            tests on their quick cases (CI runs make lock-check, make test, then this).
# make test-all: the whole suite, slow tests included (the `integration` extra).
# Each set-up installs into the one .venv only what its target needs, at the versions in requirements.lock (every
# tested version: Linux x86_64, Python 3.12), and leaves a stamp (.venv/.train, .test, .integration).
# make lock: regenerate requirements.lock from pyproject.toml (uv pip compile, keeping the locked versions that
#            still fit; `make lock UPGRADE=--upgrade` takes the newest). make lock-check: fail where it is stale.
# make lint: ruff's linter and its formatter's check over the tree (settings in pyproject.toml).
# make docs: the documentation site (docs/ and the API reference from the docstrings) built by mkdocs in strict
#            mode into site/; the set-up adds the `docs` extra (CI runs it after make test).
# make compare PRESET=cpu|gpu: the speed/memory/quality comparison and its report (python -m experiments.compare.run).
PYTHON ?= $(shell tools/find-python.sh)
VENV := .venv
LOCK := requirements.lock
PIP := $(VENV)/bin/python -m pip --quiet
INSTALL := $(PIP) install -c $(LOCK) -e
SWEEP := multirun/demo-$(shell date +%Y-%m-%d_%H-%M-%S)

PRESET ?= cpu
UPGRADE ?=
# The lock: every extra the tests and the docs use, resolved for the machines CI and the demo run on.
COMPILE := $(VENV)/bin/uv pip compile --quiet pyproject.toml --extra integration --extra docs --python-version 3.12 \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock"

.PHONY: demo test test-integration test-all lint docs compare lock lock-check clean

$(VENV)/.base:
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found; install one or pass PYTHON=/path/to/python3.12" >&2; exit 1; }
	"$(PYTHON)" -m venv $(VENV)
	$(PIP) install pip==26.3
	touch $@

$(VENV)/.train: $(VENV)/.base pyproject.toml $(LOCK)
	$(INSTALL) '.[train]'
	touch $@

$(VENV)/.test: $(VENV)/.base pyproject.toml $(LOCK)
	$(INSTALL) '.[test]'
	touch $@

$(VENV)/.integration: $(VENV)/.base pyproject.toml $(LOCK)
	$(INSTALL) '.[integration]'
	touch $@

$(VENV)/bin/uv: $(VENV)/.base
	$(PIP) install uv==0.13.9

demo: $(VENV)/.train
	$(VENV)/bin/python train.py -m experiment=mqar_demo hydra.sweep.dir=$(SWEEP)
	$(VENV)/bin/python -m experiments.summarize_sweep $(SWEEP)

test: $(VENV)/.test
	$(VENV)/bin/python -m pytest -q -n 2 -m "not slow and not integration"  # two workers: the tests are mostly single-threaded compilation

test-integration: $(VENV)/.integration
	$(VENV)/bin/python -m pytest -q -n 2 -m "integration and not slow"

test-all: $(VENV)/.integration
	$(VENV)/bin/python -m pytest -q -n 2

lint: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

$(VENV)/.docs: $(VENV)/.base pyproject.toml $(LOCK)
	$(INSTALL) '.[docs]'
	touch $@

docs: $(VENV)/.docs
	$(VENV)/bin/python -m mkdocs build --strict --site-dir site

compare: $(VENV)/.train
	$(VENV)/bin/python -m experiments.compare.run --preset $(PRESET)

lock: $(VENV)/bin/uv
	$(COMPILE) $(UPGRADE) -o $(LOCK)

# Recompiling (the lock's versions preferred) must give the lock back: a dependency added, removed or re-ranged in
# pyproject.toml without `make lock`, or a lock edited by hand, fails here.
lock-check: $(VENV)/bin/uv
	cp $(LOCK) $(VENV)/lock-check.txt
	$(COMPILE) -o $(VENV)/lock-check.txt
	@diff -u $(LOCK) $(VENV)/lock-check.txt || { echo "error: $(LOCK) is stale against pyproject.toml: run make lock and commit it" >&2; exit 1; }

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site

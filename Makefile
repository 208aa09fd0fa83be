# make demo: set up .venv (a Python >= 3.12 found on PATH or under pyenv) and run the main job: a Hydra sweep of
#            softmax, a sliding window, power and a hybrid on a near and a far MQAR cell (CPU, about 9 minutes on
#            2 idle cores), then its table and the TensorBoard command.
# make test: the same set-up, then the quick tier of the library's tests: ops, kernels, modules, generation, data,
#            the trainer's parts in process, on their quick cases (within 15 minutes on 2 cores; PERF_LOG, "the
#            suite's time"). Left out: further cases (marked slow) and the integration tests (marked integration:
#            trainer runs, the 8-device files, the wheel, the serving layer, the experiments, transformers and
#            lm-eval).
# make test-integration: the integration tests on their quick cases (CI runs make test, then this).
# make test-all: the whole suite, slow tests included.
# The set-up installs the project editable with its `train` and `test` extras, at the versions in constraints.txt.
# make lint: ruff's linter and its formatter's check over the tree (settings in pyproject.toml).
# make docs: the documentation site (docs/ and the API reference from the docstrings) built by mkdocs in strict
#            mode into site/; the set-up adds the `docs` extra (CI runs it after make test).
# make compare PRESET=cpu|gpu: the speed/memory/quality comparison and its report (python -m experiments.compare.run).
PYTHON ?= $(shell tools/find-python.sh)
VENV := .venv
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed
SWEEP := multirun/demo-$(shell date +%Y-%m-%d_%H-%M-%S)

PRESET ?= cpu

.PHONY: demo test test-integration test-all lint docs compare clean

$(STAMP): pyproject.toml constraints.txt
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found; install one or pass PYTHON=/path/to/python3.12" >&2; exit 1; }
	"$(PYTHON)" -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[train,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python train.py -m experiment=mqar_demo hydra.sweep.dir=$(SWEEP)
	$(VENV)/bin/python -m experiments.summarize_sweep $(SWEEP)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 -m "not slow and not integration"  # two workers: the tests are mostly single-threaded compilation

test-integration: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 -m "integration and not slow"

test-all: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

$(DOCS_STAMP): $(STAMP)
	$(VENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(VENV)/bin/python -m mkdocs build --strict --site-dir site

compare: $(STAMP)
	$(VENV)/bin/python -m experiments.compare.run --preset $(PRESET)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site

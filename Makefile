# make demo: set up .venv (a Python >= 3.12 found on PATH or under pyenv) and run the main job.
# make test: the same set-up, then the test suite.
PYTHON ?= $(shell tools/find-python.sh)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found; install one or pass PYTHON=/path/to/python3.12" >&2; exit 1; }
	"$(PYTHON)" -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python experiments/op_speed.py --quick

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache

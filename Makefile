# Two entry points: `make run` (the main job) and `make test` (everything). Each bootstraps .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.run-stamp
TEST_STAMP := $(VENV)/.test-stamp
PYTEST_WORKERS ?= 2
# `make test` is deterministic everywhere (the derandomized ci profile); `make slow` explores.
export HYPOTHESIS_PROFILE ?= ci

.PHONY: run test lint fast quality slow vectors clean

# The reference needs only sortedcontainers: `make run` stays quick on a fresh machine.
$(RUN_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c requirements-ci.txt sortedcontainers
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . \
	  || $(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

$(TEST_STAMP): $(RUN_STAMP) requirements-ci.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-ci.txt
	touch $@

run: $(RUN_STAMP)
	$(VENV)/bin/kvarena replay

test: $(TEST_STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow" -p no:cacheprovider

lint: $(TEST_STAMP)
	$(PY) -m ruff check .

slow: $(TEST_STAMP)
	HYPOTHESIS_PROFILE=nightly $(PY) -m pytest -q -n $(PYTEST_WORKERS) -m slow

vectors: $(TEST_STAMP)
	$(VENV)/bin/kvarena vectors --write

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .ruff_cache

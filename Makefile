# Two entry points: `make run` (the main job) and `make test` (everything). Each bootstraps .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.run-stamp
TEST_STAMP := $(VENV)/.test-stamp
PYTEST_WORKERS ?= 2
# `make test` is deterministic everywhere (the derandomized ci profile); `make slow` explores.
export HYPOTHESIS_PROFILE ?= ci

.PHONY: run test lint fast quality slow vectors wheel clean

# The reference needs only sortedcontainers: `make run` stays quick on a fresh machine.
$(RUN_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c requirements-ci.txt sortedcontainers
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

$(TEST_STAMP): $(RUN_STAMP) requirements-ci.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-ci.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(SGLANG_PINS)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(VLLM_PINS)
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

# A wheel to install elsewhere (docs/ci.md): dist/kvarena-<version>-py3-none-any.whl, spec and vectors inside.
# build/ goes first: setuptools would otherwise package files left there by an earlier build.
wheel: $(RUN_STAMP)
	rm -rf build
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps -w dist .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis .ruff_cache

# SGLang 0.5.23's real unified allocator under the conformance harness at `safety`
# (engines/sglang/adapter.py, findings in docs/sglang-findings.md). sglang is installed without its
# dependency set; msgspec is the one of its dependencies the allocator's import chain needs.
SGLANG_PINS := sglang==0.5.23 msgspec==0.22.0
.PHONY: sglang
sglang: $(TEST_STAMP)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(SGLANG_PINS)
	$(PY) -m pytest -q -p no:cacheprovider -m "sglang and not slow" tests/sglang

# vLLM 0.33.0's real v1 KV cache manager at kvarena's block-pool level (engines/vllm/, findings in
# docs/vllm-findings.md). vllm is installed without its dependency set (it pins a CUDA torch 2.14.0, pydantic,
# transformers, ...); msgspec, cbor2 and regex are the ones the KV cache manager's import chain executes.
VLLM_PINS := vllm==0.33.0 msgspec==0.22.0 cbor2==6.3.0 regex==2026.11.19
.PHONY: vllm
vllm: $(TEST_STAMP)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(VLLM_PINS)
	$(PY) -m pytest -q -p no:cacheprovider -m "vllm and not slow" tests/vllm

# transformers 5.23.0 (pinned in requirements-ci.txt, so `make test` runs these too): tiny random-weight models of
# seven hybrid families generating on ArenaCache, continuous batching on the arena, and transformers' own paged
# allocator under the contract (tests/transformers/).
.PHONY: transformers
transformers: $(TEST_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "transformers and not slow" tests/transformers

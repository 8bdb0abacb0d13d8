PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE ?= disabled

.PHONY: run test test-quick test-all install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[llm,mujoco,metaworld,viz,dev]'
	touch $(STAMP)

install: $(STAMP)

## run: create .venv, install, run the demo on CPU: the reasoning workflow trains a tiny transformer on arithmetic (warm start, then GRPO)
run: $(STAMP)
	$(BIN)/m2flow demo

## test: create .venv, install, run the test suite (without the tests marked slow), then its in-process learning tests again on a second CPU float path
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --durations=15
	@cap=$$($(BIN)/python .ci/other_capability.py); \
	if [ -n "$$cap" ]; then \
		ATEN_CPU_CAPABILITY=$$cap $(BIN)/python -m pytest -q -m "learning and not slow and not ray"; \
	fi

## test-quick: the in-process tests only (no Ray workers, nothing slow), for development
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not ray"

## test-all: every test, the slow learning checks included
test-all: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache

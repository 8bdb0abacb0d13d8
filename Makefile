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
# Two streams at once: the tests that start Ray workers in the foreground, the in-process ones (and the
# second float path) in the background at a lower CPU priority, their report printed after. The Ray
# tests wait on processes starting, deadlines and restarts, and most in-process tests keep one core
# busy; each fills the other's gaps, and the lower priority never takes a core from a Ray worker whose
# deadline a test measures (11:52 in all from a clean clone, 17:50 one stream after the other).
# PYTHONFAULTHANDLER: a crash of the Ray stream's process, even after its last test, prints every thread's stack.
test: $(STAMP)
	@log=$$(mktemp); \
	( nice -n 10 $(BIN)/python -m pytest -q -m "not slow and not ray" --durations=10 -o cache_dir=.pytest_cache/in_process \
	      --basetemp=$$log.d \
	  && cap=$$($(BIN)/python .ci/other_capability.py) \
	  && if [ -n "$$cap" ]; then ATEN_CPU_CAPABILITY=$$cap nice -n 10 $(BIN)/python -m pytest -q \
	      -m "learning and not slow and not ray" -o cache_dir=.pytest_cache/in_process --basetemp=$$log.d; fi \
	) > $$log 2>&1 & bg=$$!; \
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest -q -m "ray and not slow" --durations=10; ray=$$?; \
	wait $$bg; inproc=$$?; \
	echo; echo "---- in-process tests (run beside the Ray tests) ----"; cat $$log; rm -rf $$log $$log.d; \
	echo "Ray tests: exit $$ray; in-process tests: exit $$inproc"; \
	[ $$ray -eq 0 ] && [ $$inproc -eq 0 ]

## test-quick: the in-process tests only (no Ray workers, nothing slow), for development
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not ray"

## test-all: every test, the slow learning checks included
test-all: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache

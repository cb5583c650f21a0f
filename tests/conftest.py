"""Test-wide setup: 8 simulated CPU devices, set before JAX is imported anywhere; one
compilation cache for the whole run; the slow tests scheduled first; no gin binding
outlives its test."""

import os
import shutil
import tempfile

import pytest

from jaxrl_llm import cpu_devices

# Must happen before the first `import jax` in the process, so sharding bugs show on CPU.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()
# A CPU client thread pool large enough that collectives of the simulated devices cannot
# deadlock (jaxrl_llm/cpu_devices.py, docs/testing.md). Subprocesses inherit it.
cpu_devices.size_thread_pool()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One persistent compilation cache for the whole run, shared by the xdist workers and by the
# subprocesses the end-to-end tests start (they inherit the environment): many tests compile
# the same programs (the tiny model's steps, the default run's), and a cache hit loads the
# same executable XLA would build again, so results are unchanged. A new, empty cache each
# run, removed at the end: nothing carries over from an earlier run, so a run's time and
# result never depend on what ran before. Set JAX_COMPILATION_CACHE_DIR to keep one across
# runs (the inner loop).
_OWN_JIT_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_JIT_CACHE = tempfile.mkdtemp(prefix="jaxrl-llm-tests-jit-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_JIT_CACHE
# Programs that compile in under this many seconds are rebuilt rather than cached.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


def pytest_unconfigure(config):
    if _OWN_JIT_CACHE is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(_OWN_JIT_CACHE, ignore_errors=True)


# The longest tests, in seconds, from the fresh-clone run of 62636bc on the AMD EPYC AVX2 host
# (2026-12-04, 2 workers; docs/testing.md), the two-backend test re-measured at 12 steps. They
# start first, longest first: a long test that starts late leaves the other worker idle
# while it finishes (longest-processing-time-first scheduling bounds that by the shortest).
LONGEST = {
    "tests/integration/test_backends_train.py::test_the_default_task_trains_on_either_backend": 380,
    "tests/integration/test_multihost.py::"
    "test_an_overlapped_rl_loop_on_two_hosts_matches_one_host_and_resumes": 226,
    "tests/repro/test_repro_smoke.py::test_limr_smoke_runs_every_arm": 223,
    "tests/learner/test_rl_loop.py::test_sigkill_and_resume_matches_uninterrupted_run": 217,
    "tests/integration/test_multihost.py::"
    "test_rl_loop_on_two_hosts_matches_one_host_and_resumes": 205,
    "tests/repro/test_repro_smoke.py::test_search_r1_smoke_runs_every_arm": 148,
    "tests/learner/test_reward_training.py::"
    "test_short_run_learns_held_out_preferences_and_rm_scores_them": 128,
    "tests/learner/test_rl_loop.py::test_packed_run_equals_unpacked_run": 127,
    "tests/integration/test_multihost.py::test_two_processes_match_one_process": 110,
    "tests/learner/test_lora_export_run.py::"
    "test_lora_run_checkpoints_adapters_only_and_resumes": 107,
    "tests/learner/test_rl_loop.py::test_ppo_with_critic_and_kl_options": 81,
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests marked slow first, the `LONGEST` of them longest first (a stable sort keeps
    the order otherwise): with two xdist workers the minutes-long runs start at once and the
    short tests fill in around them, instead of one worker finishing a long run alone at the
    end."""

    def key(item):
        seconds = LONGEST.get(item.nodeid.split("[")[0], 0)
        return (item.get_closest_marker("slow") is None, -seconds)

    items.sort(key=key)


@pytest.fixture(autouse=True)
def _no_gin_bindings_left():
    """Every test ends with gin's bindings cleared: one that parses a config (a shipped gin
    file, a run's) would otherwise hand its bindings (e.g. `RolloutConfig.tool`) to the
    configs a later test of the same worker builds, a failure that depends on the order."""
    yield
    import gin

    gin.clear_config()


@pytest.fixture(scope="module")
def search_task(tmp_path_factory):
    """(A `SearchTool` over the built-in retrieval task's corpus, k = 2; its 5 val rows)."""
    import json

    from jaxrl_llm.data.tasks import retrieval
    from jaxrl_llm.tools.search import make_search_tool

    paths = retrieval.write_task(tmp_path_factory.mktemp("retrieval"), n_train=30, n_val=5)
    rows = [json.loads(line) for line in paths["val"].read_text().splitlines()]
    return make_search_tool(paths["corpus"], k=2), rows

"""Test-wide setup: 8 simulated CPU devices, set before JAX is imported anywhere; one
compilation cache for the whole run; the slow tests scheduled first; no gin binding
outlives its test."""

import os
import shutil
import socket
import tempfile

import pytest

from jaxrl_llm import cpu_devices
from jaxrl_llm.user_cache import prune_cache, user_cache_dir

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
# same executable XLA would build again, so results are unchanged. By default a new, empty
# cache each run, removed at the end: nothing carries over from an earlier run, so a run's
# time and result never depend on what ran before (`make test`, CI). The inner loop keeps
# its programs instead (`make test-fast` sets JAXRL_LLM_TEST_CACHE=keep): the user's test
# cache folder, every program cached, so a second run compiles only what changed; pruned
# when a run starts (`user_cache.prune_cache`). Set JAX_COMPILATION_CACHE_DIR to name
# another folder.
KEPT_CACHE_BYTES = 1 << 30  # the fast tier's programs take 12-18 MB
_KEPT_JIT_CACHE = None
_OWN_JIT_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    if os.environ.get("JAXRL_LLM_TEST_CACHE") == "keep":
        _KEPT_JIT_CACHE = user_cache_dir("test-xla")
        os.makedirs(_KEPT_JIT_CACHE, exist_ok=True)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = _KEPT_JIT_CACHE
    else:
        _OWN_JIT_CACHE = tempfile.mkdtemp(prefix="jaxrl-llm-tests-jit-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_JIT_CACHE
# Programs that compile in under this many seconds are rebuilt rather than cached: within
# one run few small programs recur (docs/testing.md); a kept cache meets them all again.
os.environ.setdefault(
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0" if _KEPT_JIT_CACHE else "0.5"
)


def pytest_configure(config):
    if _KEPT_JIT_CACHE is not None and not hasattr(config, "workerinput"):
        prune_cache(_KEPT_JIT_CACHE, KEPT_CACHE_BYTES)


def pytest_unconfigure(config):
    if _OWN_JIT_CACHE is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(_OWN_JIT_CACHE, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests marked slow first (a stable sort keeps the order within each group): with
    two xdist workers the minutes-long runs start at once and the short tests fill in around
    them, instead of one worker finishing a long run alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _no_gin_bindings_left():
    """Every test ends with gin's bindings cleared: one that parses a config (a shipped gin
    file, a run's) would otherwise hand its bindings (e.g. `RolloutConfig.tool`) to the
    configs a later test of the same worker builds, a failure that depends on the order."""
    yield
    import gin

    gin.clear_config()


@pytest.fixture
def reserve_port():
    """A function giving a free local TCP port for a coordinator the test starts, held for
    the test by a socket of ours bound with SO_REUSEPORT. JAX's coordination service (gRPC)
    binds with SO_REUSEPORT too, so it can take the port while we hold it, and no other
    process can (a bind without the option, or by another user, fails). A port found free
    and released before the coordinator bound it could be taken in between."""
    held: list[socket.socket] = []

    def reserve() -> int:
        s = socket.socket()
        held.append(s)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

    yield reserve
    for s in held:
        s.close()


@pytest.fixture
def builtin_copy(tmp_path):
    """A copy of the shipped tiny checkpoint in the test's own folder, to edit or damage."""
    from jaxrl_llm.assets import builtin_checkpoint

    path = tmp_path / "builtin"
    shutil.copytree(builtin_checkpoint(), path)
    return path


@pytest.fixture(scope="module")
def search_task(tmp_path_factory):
    """(A `SearchTool` over the built-in retrieval task's corpus, k = 2; its 5 val rows)."""
    import json

    from jaxrl_llm.data.tasks import retrieval
    from jaxrl_llm.tools.search import make_search_tool

    paths = retrieval.write_task(tmp_path_factory.mktemp("retrieval"), n_train=30, n_val=5)
    rows = [json.loads(line) for line in paths["val"].read_text().splitlines()]
    return make_search_tool(paths["corpus"], k=2), rows

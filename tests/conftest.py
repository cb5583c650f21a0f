"""Test-wide setup: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os

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

"""Test-wide setup: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os

# Must happen before the first `import jax` in the process, so sharding bugs show on CPU.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
# The 8 simulated devices share one process's threads, and on a 2-core machine their
# collectives stalled in some runs of the long RL-loop tests (docs/testing.md). So: no Eigen
# intra-op thread pool (a reported cause of XLA:CPU pool wedges; the suite is no slower
# without it here), and a 300 s rendezvous limit instead of 40 s (a loaded machine is not a
# deadlock; a real one still aborts instead of hanging CI).
for _flag in ("--xla_cpu_multi_thread_eigen=false",
              "--xla_cpu_collective_call_terminate_timeout_seconds=300",
              "--xla_cpu_collective_timeout_seconds=300"):  # fmt: skip
    if _flag.split("=")[0] not in _flags:
        _flags += f" {_flag}"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

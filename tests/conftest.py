"""Test-wide setup: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os

# Must happen before the first `import jax` in the process, so sharding bugs show on CPU.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
# The 8 simulated devices share one process's threads. Two XLA:CPU settings keep a 2-core
# machine from wedging them: no Eigen intra-op thread pool (a device's thunks run on its own
# thread; collectives otherwise were seen to stall waiting for pool workers, and the suite is
# no slower without it here), and a longer rendezvous limit than XLA's 40 s (on a loaded
# machine a collective's threads can take longer to arrive; a true deadlock still aborts).
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

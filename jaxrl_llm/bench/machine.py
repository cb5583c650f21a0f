"""What every benchmark measures besides its subject: the machine's ceilings, measured in
the same run (float32 matmul FLOP/s, streaming read bytes/s), the host they ran on, and the
checkpoint to load."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from jaxrl_llm import huge_pages
from jaxrl_llm.bench.clock import compile_cache_in_use

# Instruction-set extensions that change XLA:CPU's (and PyTorch's) kernels, hence the numbers
# and float32 summation orders: two hosts of one machine kind differ here (AVX2 only or
# AVX-512, AMX), so a benchmark names the ones its host has.
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16",
             "amx_int8", "asimd", "sve")  # fmt: skip


def host(cpuinfo: str | None = None) -> dict:
    """The CPU (model name, cores this process may use, ISA extensions from ISA_FLAGS), the
    JAX build and whether large host buffers get huge pages; `cpuinfo`: /proc/cpuinfo's
    text (read when None, empty off Linux)."""
    import jax

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name":
            model = value.strip()
        elif key in ("flags", "Features"):  # x86, ARM
            flags |= set(value.split())
    return {
        "cpu": model,
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "jax": jax.__version__,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "huge_pages": huge_pages.in_effect(),  # host buffers in 2 MiB pages (huge_pages.py)
        # Compiles read from or written to the persistent cache: off in `jaxrl-llm bench`
        # (`clock.persistent_cache_off`), so compile times are XLA's own.
        "compile_cache": compile_cache_in_use(),
    }


def waited_call(fn, clock=time.perf_counter) -> tuple[Any, float]:
    """`(out, seconds)` of one call of `fn`, timed until its arrays are ready."""
    import jax

    t0 = clock()
    out = jax.block_until_ready(fn())
    return out, clock() - t0


def fastest_call_s(fn, calls: int, clock=time.perf_counter) -> float:
    """Seconds of the fastest of `calls` calls of `fn` (each waited for): a ceiling is the
    machine at its best, as the best-of steps divided by it are."""
    return min(waited_call(fn, clock)[1] for _ in range(calls))


def machine_ceilings() -> dict:
    """float32 matmul FLOP/s and streaming read bytes/s, each the fastest of 5 calls."""
    import jax
    import jax.numpy as jnp

    n = 2048
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    flops = 2 * n**3 / fastest_call_s(lambda: mm(a), 5)
    read, nbytes = read_probe()
    bandwidth = nbytes / fastest_call_s(read, 5)
    return {"matmul_flops": flops, "read_bytes_per_s": bandwidth, "host": host()}


def read_probe():
    """`(read, nbytes)`: `read()` sums an array of `nbytes`, a streaming read of each byte
    once, as decode reads the weights (compiled and run once here, so the next call is timed
    alone)."""
    import jax
    import jax.numpy as jnp

    # Well past the caches: 256 MB on a CPU; 1 GiB on an accelerator, whose 256 MB read
    # (about 70 us on an H200) a kernel launch would visibly lengthen.
    mib = 256 if jax.default_backend() == "cpu" else 1024
    big = jnp.ones(mib * 2**18, jnp.float32)
    total = jax.jit(jnp.sum)
    total(big).block_until_ready()
    return (lambda: total(big)), big.nbytes


def bench_checkpoint(name: str, tmp: Path) -> Path:
    """A checkpoint directory, 'builtin', or a `models.presets` shape name (random weights
    written to `tmp`)."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.models.presets import PRESETS, write_random_checkpoint

    if name in PRESETS:
        return write_random_checkpoint(name, tmp)
    return resolve_checkpoint(name, "--checkpoint", tokenizer=False)  # prompts are token ids

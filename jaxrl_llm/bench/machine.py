"""What every benchmark measures besides its subject: the machine's ceilings, measured in
the same run (float32 matmul FLOP/s, streaming read bytes/s), and the checkpoint to load."""

from __future__ import annotations

import time
from pathlib import Path


def machine_ceilings() -> dict:
    import jax
    import jax.numpy as jnp

    n = 2048
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(5):
        mm(a).block_until_ready()
    flops = 5 * 2 * n**3 / (time.perf_counter() - t0)
    big = jnp.ones(64 * 2**20, jnp.float32)  # 256 MB, well past the caches
    total = jax.jit(jnp.sum)
    total(big).block_until_ready()
    best = float("inf")
    for _ in range(5):  # a streaming read, as decode reads the weights
        t0 = time.perf_counter()
        total(big).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    bandwidth = big.nbytes / best
    return {"matmul_flops": flops, "read_bytes_per_s": bandwidth}


def bench_checkpoint(name: str, tmp: Path) -> Path:
    """A checkpoint directory, 'builtin', or a `models.presets` shape name (random weights
    written to `tmp`)."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.models.presets import PRESETS, write_random_checkpoint

    if name in PRESETS:
        return write_random_checkpoint(name, tmp)
    return resolve_checkpoint(name, "--checkpoint", tokenizer=False)  # prompts are token ids

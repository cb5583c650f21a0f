"""KV-cache accounting shared by the rollout benchmarks: sizes and bytes the decode
attention reads (`models.paged.pages_read`, the pure-JAX walk's own rule)."""

from __future__ import annotations

import numpy as np


def kv_fields(engine, pages_held: int) -> dict:
    """The engine's KV cache sizes: bytes per token (all layers), the pool, and the pages
    held at the peak of a run."""
    page_bytes = engine.page_size * engine.kv_bytes_per_token()
    return {
        "page_size": engine.page_size,
        "kv_bytes_per_token": engine.kv_bytes_per_token(),
        "kv_pool_bytes": engine.kv_pool_bytes(),
        "peak_kv_bytes": pages_held * page_bytes,
    }


def kv_bytes_read(engine, kv_lens_per_step) -> int:
    """KV bytes the decode attention reads over steps whose rows hold `kv_lens` tokens
    (the pure-JAX walk's own accounting, `models.paged.pages_read`; every layer)."""
    from jaxrl_llm.models.paged import pages_read

    page_bytes = engine.page_size * engine.kv_bytes_per_token()
    ps, pps = engine.page_size, engine.pages_per_seq
    pages = sum(pages_read(np.asarray(lens), ps, pps) for lens in kv_lens_per_step)
    return pages * page_bytes

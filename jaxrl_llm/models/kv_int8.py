"""The int8 KV pool: `Int8Pages`, what `RolloutConfig.kv_cache_dtype = "int8"` stores.

Each token's key and value heads are int8 with one float32 scale per (token, combined head):
s = max |x| over the head dim / 127, x_q = round(x / s), each element off by at most s / 2.
Scales are per token rather than per page because a page fills one token at a time: a
page-wide scale fixed by its first tokens would clip later, larger ones, and refitting it
re-quantises the page on every write. The scale costs 4 bytes per H int8 values (6% at
H = 64). `models.paged` writes through `quantize_kv` and reads through `take_pages`, which
gathers the pages a walk reads and dequantises that block only, never the whole pool.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp

from jaxrl_llm.models.config import as_dtype

Array = jax.Array
Leaf = TypeVar("Leaf")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Int8Pages(Generic[Leaf]):
    """A layer's pool stored as int8 (see the module docstring): values [P, ps, 2K, H] int8,
    scales [P, ps, 2K] float32 (or their shardings). `shape` is the float pool's, so the
    walks read it alike."""

    values: Leaf
    scales: Leaf

    @property
    def shape(self) -> tuple[int, ...]:
        values: Any = self.values  # an array's (a sharding tree has no shape)
        return values.shape


Pool = Array | Int8Pages[Array]
KV_INT8_MAX = 127.0


def pool_dtype(dtype: Any) -> Any:
    """A pool's dtype from a name or dtype: int8 for "int8", else a float (`as_dtype`)."""
    if (dtype == "int8") if isinstance(dtype, str) else jnp.dtype(dtype) == jnp.int8:
        return jnp.dtype(jnp.int8)
    return as_dtype(dtype)


def new_pool(shape: tuple[int, int, int, int], dtype: Any) -> Pool:
    """An empty pool [P, ps, 2K, H] of `dtype`; int8: an `Int8Pages`."""
    if jnp.dtype(dtype) == jnp.int8:
        return Int8Pages(jnp.zeros(shape, jnp.int8), jnp.zeros(shape[:-1], jnp.float32))
    return jnp.zeros(shape, dtype)


def pool_bytes_per_token(heads: int, head_dim: int, dtype: Any) -> int:
    """Bytes one token's keys and values take in one layer's pool (`heads` = 2K)."""
    size = jnp.dtype(dtype).itemsize
    return heads * (head_dim * size + (4 if size == 1 else 0))  # int8: + a float32 scale


def quantize_kv(x: Array) -> tuple[Array, Array]:
    """x [..., H] -> (int8 [..., H], float32 scale [...]): one scale per vector."""
    x32 = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(x32), axis=-1)
    scale = jnp.where(absmax > 0, absmax / KV_INT8_MAX, 1.0)
    q = jnp.clip(jnp.round(x32 / scale[..., None]), -KV_INT8_MAX, KV_INT8_MAX)
    return q.astype(jnp.int8), scale


def take_pages(pool: Pool, pages: Array) -> Array:
    """`pool[pages]` ([..., ps, 2K, H]) as floats: an int8 pool's gathered block is
    dequantised (float32), the rest of the pool is not read."""
    if isinstance(pool, Int8Pages):
        return pool.values[pages].astype(jnp.float32) * pool.scales[pages][..., None]
    return pool[pages]

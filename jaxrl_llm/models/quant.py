"""Int8 weights for a frozen LoRA base (QLoRA-style, `LoraConfig.quantize_base = 'int8'`).

A weight W [in..., out...] is stored as int8 W_q with one scale per output channel,
s[out...] = max |W| over the input dims / 127, W_q = round(W / s): each element is off by at
most s / 2. Scaling commutes with the contraction over the input dims, so the layer computes
x W ~= (x W_q) * s, reading one byte per weight element instead of two or four. (QLoRA's
4-bit NormalFloat with double quantisation is not implemented.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

INT8_MAX = 127.0


def quantize_int8(w: Array, in_dims: int) -> tuple[Array, Array]:
    """(W_q int8, s [out...] in W's dtype) of W [in..., out...], per output channel."""
    w32 = w.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(w32), axis=tuple(range(in_dims)))
    scale = jnp.where(absmax > 0, absmax / INT8_MAX, 1.0)
    q = jnp.clip(jnp.round(w32 / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return q, scale.astype(w.dtype)


def dequantize(q: Array, scale: Array) -> Array:
    """W_q * s in s's dtype (s broadcasts over the leading input dims)."""
    return (q.astype(jnp.float32) * scale.astype(jnp.float32)).astype(scale.dtype)

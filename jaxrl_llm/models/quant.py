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
from flax import nnx
from jax.core import Tracer
from jax.sharding import NamedSharding, PartitionSpec

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


_quantize_jit = jax.jit(quantize_int8, static_argnums=1)


def quantize_variable(weight: nnx.Param, in_dims: int) -> nnx.Param:
    """Store `weight` as int8 in place and return its per-output-channel scales as a Param.

    Both keep the float weight's layout: the int8 array its sharding, the scales the
    sharding of its output dims (logical axes likewise). Used by `lora.apply_lora` on a
    loaded model and by `hf_io.from_pretrained(quantize=...)` on each weight as it is read,
    so a model whose float weights do not fit never holds them all at once.
    """
    w = weight.get_value()
    axes = tuple(weight.get_metadata()["logical_axes"])
    q, scale = _quantize_jit(w, in_dims)
    sharding = getattr(w, "sharding", None)
    if isinstance(sharding, NamedSharding) and not isinstance(q, Tracer):
        q = jax.device_put(q, sharding)
        spec = tuple(sharding.spec) + (None,) * (w.ndim - len(sharding.spec))
        scale = jax.device_put(scale, NamedSharding(sharding.mesh, PartitionSpec(*spec[in_dims:])))
    weight.set_value(q)
    return nnx.Param(scale, logical_axes=axes[in_dims:])

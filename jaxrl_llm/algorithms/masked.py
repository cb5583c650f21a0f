"""Masked reductions over response tokens.

Shape legend: B batch (prompts x G), G group size, T tokens, V vocab.
Masks are 1 where a token counts (a model-generated response token) and 0 elsewhere (padding,
prompt, inserted tool output). Bool or float masks both work.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array


def compute_dtype(*xs: Array) -> jnp.dtype:
    """At least float32: bfloat16 statistics (means, variances, exp) lose too much."""
    return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def safe_divide(num: Array, den: Array) -> Array:
    """``num / den`` where ``den > 0`` else 0, with finite gradients everywhere."""
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1), 0)


def masked_sum(values: Array, mask: Array, axis: int | None = None) -> Array:
    """``sum(values * mask)``; NaN/inf at masked positions do not leak in."""
    mask = jnp.asarray(mask)
    return jnp.sum(jnp.where(mask.astype(bool), values * mask, 0), axis=axis)


def masked_mean(values: Array, mask: Array, axis: int | None = None) -> Array:
    """``sum(values * mask) / sum(mask)``; 0 where the mask is empty (verl divides by 0)."""
    mask = jnp.asarray(mask)
    dtype = compute_dtype(values)
    return safe_divide(
        masked_sum(values.astype(dtype), mask, axis), jnp.sum(mask.astype(dtype), axis=axis)
    )


def masked_max(values: Array, mask: Array) -> Array:
    """The largest value where ``mask > 0``; 0 where the mask is empty."""
    keep = jnp.asarray(mask) > 0
    return jnp.where(jnp.any(keep), jnp.max(jnp.where(keep, values, -jnp.inf)), 0)


def masked_min(values: Array, mask: Array) -> Array:
    """The smallest value where ``mask > 0``; 0 where the mask is empty."""
    return -masked_max(-values, mask)


def masked_var(values: Array, mask: Array, *, unbiased: bool = True) -> Array:
    """Variance over all masked elements; Bessel-corrected ``n / (n - 1)`` by default.

    Source: verl ``torch_functional.masked_var``. Deviation: verl raises for n <= 1; here the
    correction is skipped for n <= 1 (the variance is then 0), because a jitted function cannot
    raise on data.
    """
    mask = jnp.asarray(mask)
    dtype = compute_dtype(values)
    values = values.astype(dtype)
    mean = masked_mean(values, mask)
    var = masked_mean(jnp.square(values - mean), mask)
    if unbiased:
        n = jnp.sum(mask.astype(dtype))
        var = var * jnp.where(n > 1, n / jnp.maximum(n - 1, 1), 1)
    return var


def masked_whiten(
    values: Array, mask: Array, *, shift_mean: bool = True, eps: float = 1e-8
) -> Array:
    """``(x - mean) * rsqrt(var + eps)`` with mean and unbiased var over masked elements.

    Source: verl ``torch_functional.masked_whiten`` (which uses eps 1e-8 inside the rsqrt and
    Bessel's correction). With ``shift_mean=False`` the mean is added back. Positions outside
    the mask are transformed too; callers multiply by the mask when they need zeros there.
    """
    dtype = compute_dtype(values)
    values = values.astype(dtype)
    mean = masked_mean(values, mask)
    whitened = (values - mean) * jnp.reciprocal(jnp.sqrt(masked_var(values, mask) + eps))
    return whitened if shift_mean else whitened + mean

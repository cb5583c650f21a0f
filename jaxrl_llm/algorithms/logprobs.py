"""Token log-probabilities and entropy from logits, without a second ``[B, T, V]`` float32 copy.

Shape legend: B batch, T tokens, V vocab.

``log_softmax(x)_v = x_v - logsumexp(x)``: only the chosen token's logit and one logsumexp per
position are needed, never the full normalised ``[B, T, V]`` array. With ``chunk_size`` the
sequence axis is processed ``chunk_size`` positions at a time inside a ``lax.map`` whose body is
rematerialised (``jax.checkpoint``), so the float32 upcast, the softmax and the backward-pass
residuals exist for one ``[B, chunk, V]`` block at a time. The gradient with respect to the
logits is still ``[B, T, V]``; fusing this with the LM head is the learner's business.

Known limit: XLA:CPU upcasts a whole bfloat16 array to float32 before slicing it inside a
loop, so on CPU chunking bf16 logits saves nothing (float32 logits chunk as intended). Check
accelerators with ``jax.jit(...).lower(...).compile().memory_analysis()``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array


def _shifted(logits: Array, temperature: float) -> tuple[Array, Array]:
    """``(x - max x, log sum exp(x - max x))`` for ``x = logits / temperature`` in float32.

    Subtracting the max first keeps the result exact to float32 rounding of the *differences*
    (``x_y - logsumexp(x)`` loses digits when the logits are large, e.g. 3e4).
    """
    x = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    if not (isinstance(temperature, int | float) and temperature == 1.0):  # may be traced
        x = x / temperature
    x = x - jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    return x, jnp.log(jnp.sum(jnp.exp(x), axis=-1))


def _chunked(
    fn: Callable[..., Array], logits: Array, extras: tuple[Array, ...], chunk_size: int | None
) -> Array:
    """Apply ``fn(logits[:, s], *extras[:, s]) -> [B, s]`` over chunks of the T axis."""
    t = logits.shape[1]
    if chunk_size is None or chunk_size >= t:
        return fn(logits, *extras)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n_full = t // chunk_size
    body = jax.checkpoint(fn)

    def one_chunk(i: Array) -> Array:
        start = i * chunk_size
        sl = lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk_size, axis=1)
        return body(sl(logits), *(sl(e) for e in extras))

    out = jax.lax.map(one_chunk, jnp.arange(n_full))  # [n, B, chunk]
    out = jnp.moveaxis(out, 0, 1).reshape(logits.shape[0], n_full * chunk_size)
    rest = n_full * chunk_size
    if rest < t:
        out = jnp.concatenate([out, body(logits[:, rest:], *(e[:, rest:] for e in extras))], axis=1)
    return out


def token_logprobs(
    logits: Array,
    tokens: Array,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Array:
    """Log-probability of each given token under ``softmax(logits / temperature)``.

    Formula: ``logp[b, t] = x[b, t, tokens[b, t]] - logsumexp_v x[b, t, v]``, with
    ``x = logits / temperature`` computed in float32 (shifted by its max first).

    Source: verl ``logprobs_from_logits_v2`` (gather minus logsumexp); the temperature division
    matches verl's actor, which divides logits by the rollout temperature so that the learner's
    log-probs are those of the sampling distribution.

    Shapes: ``logits`` Float[Array, "B T V"] (any float dtype), ``tokens`` Int[Array, "B T"]
    (already aligned: ``logits[:, t]`` predicts ``tokens[:, t]``) -> Float[Array, "B T"] float32.
    """
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens {tokens.shape} do not match logits {logits.shape}")

    def fn(lg: Array, tk: Array) -> Array:
        x, log_z = _shifted(lg, temperature)
        picked = jnp.take_along_axis(x, tk[..., None].astype(jnp.int32), axis=-1)[..., 0]
        return picked - log_z

    return _chunked(fn, logits, (tokens,), chunk_size)


def entropy(logits: Array, *, temperature: float = 1.0, chunk_size: int | None = None) -> Array:
    """Entropy of ``softmax(logits / temperature)`` at every position.

    Formula: ``H = logsumexp(x) - sum_v softmax(x)_v * x_v`` with ``x = logits / temperature``
    in float32 (equal to ``-sum p log p`` and stable for large logits).

    Source: verl ``entropy_from_logits``.

    Shapes: ``logits`` Float[Array, "B T V"] -> Float[Array, "B T"] float32.
    """

    def fn(lg: Array) -> Array:
        x, log_z = _shifted(lg, temperature)
        p = jnp.exp(x - log_z[..., None])
        return log_z - jnp.sum(p * x, axis=-1)

    return _chunked(fn, logits, (), chunk_size)

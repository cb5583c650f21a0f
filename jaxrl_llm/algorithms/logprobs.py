"""Token log-probabilities and entropy, without a second ``[B, T, V]`` float32 copy.

Shape legend: B batch, T tokens, D embed, V vocab, C chunk.

``log_softmax(x)_v = x_v - logsumexp(x)``: only the chosen token's logit and one logsumexp per
position are needed, never the full normalised ``[B, T, V]`` array. With ``chunk_size`` the
sequence axis is processed ``chunk_size`` positions at a time inside a ``lax.map`` whose body is
rematerialised (``jax.checkpoint``), so the float32 upcast, the softmax and the backward-pass
residuals exist for one ``[B, chunk, V]`` block at a time.

``token_logprobs`` / ``entropy`` take logits. ``head_logprobs`` takes hidden states and the LM
head instead, and computes logits only where a mask asks for them: the masked positions of
each row are moved to the front, and only the chunks holding at least one of them run the
head (a ``lax.cond`` per chunk), so prompt and padding positions cost no ``[*, V]`` work and
the logits and their gradient exist for one ``[B, C, V]`` block at a time.

Known limit: XLA:CPU upcasts a whole bfloat16 array to float32 before slicing it inside a
loop, so on CPU chunking bf16 logits saves nothing (float32 logits chunk as intended). Check
accelerators with ``jax.jit(...).lower(...).compile().memory_analysis()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

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


def _picked(x: Array, log_z: Array, tokens: Array) -> Array:
    """``x[..., tokens] - log_z``: the log-probability of each token from `_shifted`'s output."""
    return jnp.take_along_axis(x, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0] - log_z


def _entropy(x: Array, log_z: Array) -> Array:
    """``log_z - sum_v softmax(x)_v * x_v`` from `_shifted`'s output."""
    return log_z - jnp.sum(jnp.exp(x - log_z[..., None]) * x, axis=-1)


def _chunked(fn: Callable[..., Any], arrays: tuple[Array, ...], chunk_size: int | None) -> Any:
    """Apply ``fn(*(a[:, s] for a in arrays))`` over chunks ``s`` of the T axis (axis 1) and
    concatenate its outputs (a pytree of ``[B, s, ...]`` arrays) along that axis."""
    t = arrays[0].shape[1]
    if chunk_size is None or chunk_size >= t:
        return fn(*arrays)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n_full = t // chunk_size
    body = jax.checkpoint(fn)

    def one_chunk(i: Array) -> Any:
        start = i * chunk_size
        return body(*(jax.lax.dynamic_slice_in_dim(a, start, chunk_size, axis=1) for a in arrays))

    out = jax.lax.map(one_chunk, jnp.arange(n_full))  # leaves [n, B, chunk, ...]
    out = jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:]), out)
    rest = n_full * chunk_size
    if rest < t:
        tail = body(*(a[:, rest:] for a in arrays))
        out = jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=1), out, tail)
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
        return _picked(x, log_z, tk)

    return _chunked(fn, (logits, tokens), chunk_size)


def entropy(logits: Array, *, temperature: float = 1.0, chunk_size: int | None = None) -> Array:
    """Entropy of ``softmax(logits / temperature)`` at every position.

    Formula: ``H = logsumexp(x) - sum_v softmax(x)_v * x_v`` with ``x = logits / temperature``
    in float32 (equal to ``-sum p log p`` and stable for large logits).

    Source: verl ``entropy_from_logits``.

    Shapes: ``logits`` Float[Array, "B T V"] -> Float[Array, "B T"] float32.
    """

    def fn(lg: Array) -> Array:
        return _entropy(*_shifted(lg, temperature))

    return _chunked(fn, (logits,), chunk_size)


EntropyMode = Literal["off", "metric", "loss"]


def head_logprobs(
    hidden: Array,
    tokens: Array,
    mask: Array,
    head: Callable[[Array], Array],
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy: EntropyMode = "off",
) -> tuple[Array, Array | None]:
    """``token_logprobs`` and ``entropy`` of ``head(hidden)`` where ``mask > 0``; 0 elsewhere.

    Formula: as ``token_logprobs(head(hidden), tokens)`` and ``entropy(head(hidden))``
    (``x = logits / temperature`` in float32), evaluated at masked positions only.

    How: in each row the masked positions are moved to the front (a stable argsort), the
    compacted rows are cut into chunks of ``chunk_size`` positions (``lax.map``, each chunk
    rematerialised), a chunk runs ``head`` only when some row has a masked position in it
    (``lax.cond``: chunks past the longest row's count are skipped), and the results go back
    to their positions by the inverse permutation. Logits exist for one ``[B, C, V]`` chunk.

    ``entropy``: ``"off"`` (not computed, ``None``), ``"metric"`` (computed in the same chunks
    without a gradient), ``"loss"`` (with its gradient).

    Shapes: ``hidden`` Float[Array, "B T D"] (``hidden[:, t]`` predicts ``tokens[:, t]``),
    ``tokens`` Int[Array, "B T"], ``mask`` [B, T]; ``head``: Float[Array, "B C D"] ->
    Float[Array, "B C V"] logits -> (Float[Array, "B T"], Float[Array, "B T"] | None) float32.
    """
    if tokens.shape != mask.shape or hidden.shape[:2] != tokens.shape:
        raise ValueError(f"hidden {hidden.shape}, tokens {tokens.shape}, mask {mask.shape}")
    keep = mask > 0
    order = jnp.argsort((~keep).astype(jnp.int32), axis=1, stable=True)  # masked first
    slots = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)  # compacted index
    longest = jnp.max(jnp.sum(keep, axis=1))

    def chunk(order_c: Array, slot_c: Array) -> tuple[Array, ...]:
        def compute() -> tuple[Array, ...]:
            h = jnp.take_along_axis(hidden, order_c[..., None], axis=1)
            x, log_z = _shifted(head(h), temperature)
            out = (_picked(x, log_z, jnp.take_along_axis(tokens, order_c, axis=1)),)
            if entropy == "off":
                return out
            ent = _entropy(x, log_z)
            return (*out, ent if entropy == "loss" else jax.lax.stop_gradient(ent))

        skip = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(compute))
        return jax.lax.cond(slot_c[0, 0] < longest, compute, skip)

    outs = _chunked(chunk, (order, slots), chunk_size)
    inverse = jnp.argsort(order, axis=1)
    back = lambda x: jnp.where(keep, jnp.take_along_axis(x, inverse, axis=1), 0)
    return back(outs[0]), (back(outs[1]) if entropy != "off" else None)

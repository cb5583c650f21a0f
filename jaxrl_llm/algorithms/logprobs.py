"""Token log-probabilities and entropy, without a second ``[B, T, V]`` float32 copy.

Shape legend: B batch, T tokens, D embed, V vocab, C chunk.

``log_softmax(x)_v = x_v - logsumexp(x)``: only the chosen token's logit and one logsumexp per
position are needed, never the full normalised ``[B, T, V]`` array. With ``chunk_size`` the
sequence axis is processed ``chunk_size`` positions at a time inside a ``lax.map`` whose body is
rematerialised (``jax.checkpoint``), so the float32 upcast, the softmax and the backward-pass
residuals exist for one ``[B, chunk, V]`` block at a time.

``token_logprobs`` / ``entropy`` take logits. ``head_logprobs`` takes hidden states and the LM
head instead, and computes logits only where a mask asks for them: the masked positions of
each row are moved to the front, and a loop runs the head on the chunks holding at least one
of them (a custom VJP runs them again for the gradient), so prompt and padding positions
cost no ``[*, V]`` work and the logits and their gradient exist for one ``[B, C, V]`` block
at a time.

Known limit: XLA:CPU upcasts a whole bfloat16 array to float32 before slicing it inside a
loop, so on CPU chunking bf16 logits saves nothing (float32 logits chunk as intended). Check
accelerators with ``jax.jit(...).lower(...).compile().memory_analysis()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, cast

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

    How: in each row the masked positions are moved to the front (a stable argsort) and the
    compacted rows are cut into chunks of ``chunk_size`` positions; a loop runs the chunks
    that hold a masked position (as many as the longest row needs: the others cost nothing)
    and the results go back to their positions by the inverse permutation. The backward
    pass (a custom VJP) runs the same chunks again, recomputing each chunk's logits and
    accumulating the gradients of ``hidden`` and of the head's weights, so float32 logits
    and their gradient exist for one ``[B, chunk, V]`` block at a time.

    ``entropy``: ``"off"`` (not computed, ``None``), ``"metric"`` (computed in the same chunks
    without a gradient), ``"loss"`` (with its gradient).

    Shapes: ``hidden`` Float[Array, "B T D"] (``hidden[:, t]`` predicts ``tokens[:, t]``),
    ``tokens`` Int[Array, "B T"], ``mask`` [B, T]; ``head``: Float[Array, "B C D"] ->
    Float[Array, "B C V"] logits -> (Float[Array, "B T"], Float[Array, "B T"] | None) float32.
    Forward and reverse mode; no forward-mode (jvp) derivative.
    """
    if tokens.shape != mask.shape or hidden.shape[:2] != tokens.shape:
        raise ValueError(f"hidden {hidden.shape}, tokens {tokens.shape}, mask {mask.shape}")
    B, T = tokens.shape
    C = T if chunk_size is None else chunk_size
    if C < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    C = min(C, T)
    keep = mask > 0
    order = jnp.argsort((~keep).astype(jnp.int32), axis=1, stable=True)  # masked first
    # Whole chunks; padding slots gather position 0, and their results are never read.
    padded = jnp.pad(order, ((0, 0), (0, -T % C)))
    active = (jnp.max(jnp.sum(keep, axis=1)) + C - 1) // C  # chunks with a masked position
    fn, consts = jax.closure_convert(
        head, jax.ShapeDtypeStruct((B, C, hidden.shape[-1]), hidden.dtype)
    )
    t = jnp.asarray(temperature, jnp.float32)
    stats = _compacted(fn, C, entropy, t, hidden, tokens, padded, active, tuple(consts))
    stats = cast(tuple[Array, ...], stats)  # custom_vjp hides the return type
    inverse = jnp.argsort(order, axis=1)
    back = lambda x: jnp.where(keep, jnp.take_along_axis(x[:, :T], inverse, axis=1), 0)
    return back(stats[0]), (back(stats[1]) if entropy != "off" else None)


def _chunk_stats(fn, mode: EntropyMode, temperature, h, tk, consts) -> tuple[Array, ...]:
    """(logp, entropy) of one chunk: ``h`` [B, C, D] gathered hidden states, ``tk`` [B, C]."""
    x, log_z = _shifted(fn(h, *consts), temperature)
    lp = _picked(x, log_z, tk)
    if mode == "off":
        return (lp,)
    ent = _entropy(x, log_z)
    return lp, ent if mode == "loss" else jax.lax.stop_gradient(ent)


def _gather(hidden: Array, tokens: Array, order: Array, i: Array, C: int):
    """Chunk ``i`` of the compacted rows: its positions [B, C], hidden states, tokens."""
    o = jax.lax.dynamic_slice_in_dim(order, i * C, C, axis=1)
    return (
        o,
        jnp.take_along_axis(hidden, o[..., None], axis=1),
        jnp.take_along_axis(tokens, o, axis=1),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _compacted(fn, C, mode, temperature, hidden, tokens, order, active, consts):
    """Per compacted position (logp, entropy?) [B, n * C], chunks ``< active`` computed."""
    one = lambda h, tk: _chunk_stats(fn, mode, temperature, h, tk, consts)
    shapes = jax.eval_shape(one, *_gather(hidden, tokens, order, jnp.int32(0), C)[1:])
    init = tuple(jnp.zeros(order.shape, s.dtype) for s in shapes)

    def body(i, outs):
        _, h, tk = _gather(hidden, tokens, order, i, C)
        put = lambda a, v: jax.lax.dynamic_update_slice_in_dim(a, v, i * C, axis=1)
        return tuple(put(a, v) for a, v in zip(outs, one(h, tk), strict=True))

    return jax.lax.fori_loop(0, active, body, init)


def _compacted_fwd(fn, C, mode, temperature, hidden, tokens, order, active, consts):
    out = _compacted(fn, C, mode, temperature, hidden, tokens, order, active, consts)
    return out, (temperature, hidden, tokens, order, active, consts)


def _compacted_bwd(fn, C, mode, res, cotangents):
    """The same chunks again: each chunk's logits recomputed, its VJP applied, the gradients
    of ``hidden`` (scattered back) and of the head's weights accumulated in float32."""
    temperature, hidden, tokens, order, active, consts = res
    wide = lambda x: jnp.zeros(x.shape, jnp.promote_types(x.dtype, jnp.float32))
    rows = jnp.arange(order.shape[0])[:, None]

    def body(i, carry):
        d_hidden, d_consts = carry
        o, h, tk = _gather(hidden, tokens, order, i, C)
        _, vjp = jax.vjp(lambda h, c: _chunk_stats(fn, mode, temperature, h, tk, c), h, consts)
        cot = tuple(jax.lax.dynamic_slice_in_dim(g, i * C, C, axis=1) for g in cotangents)
        dh, dc = vjp(cot)
        d_hidden = d_hidden.at[rows, o].add(dh.astype(d_hidden.dtype))
        return d_hidden, jax.tree.map(lambda a, b: a + b.astype(a.dtype), d_consts, dc)

    init = (wide(hidden), jax.tree.map(wide, consts))
    d_hidden, d_consts = jax.lax.fori_loop(0, active, body, init)
    cast = lambda d, x: d.astype(x.dtype)
    return (
        jnp.zeros_like(temperature),
        cast(d_hidden, hidden),
        None,
        None,
        None,
        jax.tree.map(cast, d_consts, consts),
    )


_compacted.defvjp(_compacted_fwd, _compacted_bwd)

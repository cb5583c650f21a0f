"""Reduce a per-token loss ``[B, T]`` to a scalar, with a global normaliser for accumulation.

Shape legend: B batch (sequences), T tokens. ``mask`` is the loss mask (response tokens).

Modes (names of verl ``core_algos.agg_loss``); with ``s_b = sum_t mask * loss`` and
``n_b = sum_t mask``:

===========================  =====================================  ==========================
mode                         formula                                ``normalizer`` means
===========================  =====================================  ==========================
``token-mean``               ``sum_b s_b / N``                      N: total loss tokens
``seq-mean-token-sum``       ``sum_b s_b / S``                      S: number of sequences
``seq-mean-token-mean``      ``sum_b (s_b / n_b) / S``              S: number of sequences
``seq-mean-token-sum-norm``  ``sum_b (s_b / scale) / S``            S: number of sequences
===========================  =====================================  ==========================

Without ``normalizer`` N and S are counted in the given batch (S counts only sequences with at
least one loss token, so extra all-padding rows change nothing). ``scale`` (``scale_factor``)
is Dr.GRPO's constant MAX_TOKENS (arXiv:2503.20783), the response budget (generation
length), so the -norm mode divides by S x the response budget. Its default, T =
``mask.shape[-1]``, is verl's, whose loss mask is response-only; a mask over whole rows
(prompt + response, as `TrainBatch.loss_mask`) needs ``scale_factor`` = the response
budget, which the update steps pass (``RolloutConfig.max_new_tokens``).

Gradient accumulation: compute ``normalizer = loss_normalizer(minibatch_mask, mode)`` once over
the whole minibatch and pass it to every micro-batch; the sum of the micro-batch losses then
equals the full-minibatch loss, and so do the gradients. (Pass the same ``scale_factor`` to
every micro-batch too when micro-batches are padded to different lengths.)
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from jaxrl_llm.algorithms.masked import compute_dtype, safe_divide
from jaxrl_llm.algorithms.registry import available, lookup, register

Normalizer = float | Array | None


def _sums(loss: Array, mask: Array) -> tuple[Array, Array, Array]:
    dtype = compute_dtype(loss)
    mask = jnp.asarray(mask).astype(dtype)
    # where() keeps NaN/inf at masked positions (e.g. log 0 on padding) out of the sum.
    seq_sum = jnp.sum(jnp.where(mask > 0, loss.astype(dtype) * mask, 0), axis=-1)
    seq_tokens = jnp.sum(mask, axis=-1)
    return seq_sum, seq_tokens, mask


def _num_seqs(seq_tokens: Array) -> Array:
    return jnp.sum((seq_tokens > 0).astype(seq_tokens.dtype))


@register("loss_agg", "token-mean")
def agg_token_mean(
    loss: Array, mask: Array, *, normalizer: Normalizer = None, scale_factor: float | None = None
) -> Array:
    """``sum(mask * loss) / N``; N = ``normalizer`` or the number of loss tokens."""
    del scale_factor
    seq_sum, seq_tokens, _ = _sums(loss, mask)
    den = jnp.sum(seq_tokens) if normalizer is None else jnp.asarray(normalizer, seq_sum.dtype)
    return safe_divide(jnp.sum(seq_sum), den)


@register("loss_agg", "seq-mean-token-sum")
def agg_seq_mean_token_sum(
    loss: Array, mask: Array, *, normalizer: Normalizer = None, scale_factor: float | None = None
) -> Array:
    """``sum_b s_b / S``."""
    del scale_factor
    seq_sum, seq_tokens, _ = _sums(loss, mask)
    den = _num_seqs(seq_tokens) if normalizer is None else jnp.asarray(normalizer, seq_sum.dtype)
    return safe_divide(jnp.sum(seq_sum), den)


@register("loss_agg", "seq-mean-token-mean")
def agg_seq_mean_token_mean(
    loss: Array, mask: Array, *, normalizer: Normalizer = None, scale_factor: float | None = None
) -> Array:
    """``sum_b (s_b / n_b) / S``; empty sequences contribute 0."""
    del scale_factor
    seq_sum, seq_tokens, _ = _sums(loss, mask)
    den = _num_seqs(seq_tokens) if normalizer is None else jnp.asarray(normalizer, seq_sum.dtype)
    return safe_divide(jnp.sum(safe_divide(seq_sum, seq_tokens)), den)


@register("loss_agg", "seq-mean-token-sum-norm")
def agg_seq_mean_token_sum_norm(
    loss: Array, mask: Array, *, normalizer: Normalizer = None, scale_factor: float | None = None
) -> Array:
    """``sum_b (s_b / scale) / S``; scale: the response budget (default T, see above)."""
    seq_sum, seq_tokens, _ = _sums(loss, mask)
    scale = jnp.shape(mask)[-1] if scale_factor is None else scale_factor
    den = _num_seqs(seq_tokens) if normalizer is None else jnp.asarray(normalizer, seq_sum.dtype)
    return safe_divide(jnp.sum(seq_sum) / scale, den)


def _check_mode(mode: str) -> None:
    if mode not in available("loss_agg"):
        raise ValueError(
            f"unknown loss aggregation {mode!r}; choose one of: {', '.join(available('loss_agg'))}"
        )


def aggregate_loss(
    loss: Array,
    mask: Array,
    mode: str = "token-mean",
    *,
    normalizer: float | Array | None = None,
    scale_factor: float | None = None,
) -> Array:
    """Aggregate a per-token loss to a scalar (see the module docstring for the formulas).

    Source: verl ``core_algos.agg_loss`` (its newer form with a global batch normaliser and
    ``loss_scale_factor``); DAPO (arXiv:2503.14476) for token-mean; Dr.GRPO for the -norm mode.

    Shapes: ``loss`` Float[Array, "B T"], ``mask`` [B, T] -> Float[Array, ""] (float32+).

    Deviations: an empty mask gives 0, not NaN; the default sequence count S ignores rows with
    no loss token (verl's older form divides by B), so padding rows leave the loss unchanged;
    ``seq-mean-token-sum-norm`` divides by S as Dr.GRPO does (its loss is a mean over the
    group's G responses). verl's ``agg_loss`` does not: at its HEAD of 2026-01-29 it
    returns ``sum_b s_b / loss_scale_factor`` for the micro-batch (``loss_scale_factor``
    defaulting to ``loss_mask.shape[-1]``, the response length), and its actor then scales
    each micro-batch's loss by micro / mini batch size; a change dividing by the sequence
    count (verl #4510) was reverted (#4769).
    """
    _check_mode(mode)
    return lookup("loss_agg", mode)(loss, mask, normalizer=normalizer, scale_factor=scale_factor)


def loss_normalizer(mask: Array, mode: str = "token-mean") -> Array:
    """The global normaliser of ``mode`` for a whole minibatch: its loss tokens (token-mean) or
    its sequences with at least one loss token (the seq-mean modes). Shapes: [B, T] -> []."""
    _check_mode(mode)
    seq_tokens = jnp.sum(jnp.asarray(mask).astype(jnp.float32), axis=-1)
    return jnp.sum(seq_tokens) if mode == "token-mean" else _num_seqs(seq_tokens)

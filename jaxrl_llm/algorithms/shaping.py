"""Reward shaping: outcome reward onto tokens, and the KL penalty in the reward.

Shape legend: B batch, T response tokens. ``response_mask`` is 1 on model-generated response
tokens and 0 on padding and on inserted tool output (which may sit in the middle of a response).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from jaxrl_llm.algorithms.kl import kl_penalty
from jaxrl_llm.algorithms.masked import compute_dtype


def last_token_index(response_mask: Array) -> Array:
    """Index of the last unmasked token per row (Int[Array, "B"]); -1 for an empty row."""
    mask = jnp.asarray(response_mask) > 0
    positions = jnp.arange(mask.shape[-1])
    return jnp.max(jnp.where(mask, positions, -1), axis=-1)


def outcome_token_rewards(outcome: Array, response_mask: Array) -> Array:
    """Put each sequence's outcome reward on its last response token.

    Formula: ``r[b, t] = outcome[b] if t == last unmasked t of row b else 0``.

    Source: verl's reward managers (``reward_tensor[i, valid_response_length - 1] = score``).
    Deviation: "last" means the last token with mask 1, so a response whose tail is masked
    (e.g. it ends in tool output) gets the reward on its last model token, not on a masked one;
    verl uses ``sum(mask) - 1``, which is the same only for masks without holes. A row with an
    empty mask gets no reward.

    Shapes: ``outcome`` Float[Array, "B"], ``response_mask`` [B, T] -> Float[Array, "B T"].
    """
    dtype = compute_dtype(outcome)
    last = last_token_index(response_mask)
    hit = jnp.arange(jnp.shape(response_mask)[-1]) == last[:, None]
    return jnp.where(hit, outcome.astype(dtype)[:, None], 0).astype(dtype)


def kl_shaped_rewards(
    token_scores: Array,
    logprobs: Array,
    ref_logprobs: Array,
    response_mask: Array,
    *,
    kl_coef: float | Array,
    kind: str = "k1",
) -> Array:
    """Token rewards with the KL penalty in the reward (PPO-RLHF style).

    Formula: ``r[b, t] = score[b, t] - kl_coef * KL_kind(logp, ref)[b, t] * mask[b, t]``.
    Typically ``token_scores = outcome_token_rewards(outcome, response_mask)`` and ``logprobs``
    are the old (rollout-policy) log-probabilities.

    Source: Ouyang et al. 2022 (InstructGPT) eq. 2; Ziegler et al. 2019; semantics of verl
    ``apply_kl_penalty`` (default kind ``kl`` = k1). Masked positions, including tool output in
    the middle of a response, get no penalty.

    Shapes: all Float[Array, "B T"] -> Float[Array, "B T"].
    """
    dtype = compute_dtype(token_scores, logprobs)
    mask = jnp.asarray(response_mask).astype(dtype)
    kl = jnp.where(mask > 0, kl_penalty(logprobs, ref_logprobs, kind), 0)
    return token_scores.astype(dtype) - kl_coef * kl * mask

"""Off-policy correction: importance weights of the trained policy against the sampler's.

The tokens a step trains on were sampled by the sampler's policy (the behaviour policy mu:
another engine's numerics, and with overlapped RL older weights), while the PPO ratio is
taken against the trainer's own logprobs before the update (the proximal policy pi_old).
The loss is corrected by weighting each token's advantage with w = pi_old / mu, computed
from the sampler's logprobs, at one of three levels, with log r_t = log pi_old - log mu on
the trained tokens (mask 1) of a sequence of n tokens:

    token      w_t = exp(log r_t)
    sequence   w_t = exp(sum_s log r_s)          (the same for every token of the sequence)
    geometric  w_t = exp(sum_s log r_s / n)      (the per-token geometric mean of the ratios)

and one of two modes with the bounds [floor, cap]:

    truncate   w' = min(w, cap)                   (TIS: bias traded for bounded variance)
    mask       w' = w if floor <= w <= cap else 0 (MIS: the tokens / sequences outside drop)

In mask mode a rejected token (or sequence) leaves the loss mask (``rejection_mask``), as
verl's rollout rejection sampling removes it from ``response_mask``
(``rollout_corr_helper.compute_rollout_correction_and_add_to_batch``): it is out of the
policy loss, the loss normaliser (token count or sequence count), the KL loss and the
entropy term, not only weighted 0. (AReaL's ``behav_imp_weight_cap`` instead zeroes the
weight and keeps the token in the normaliser.) The update step applies the rejection to the
whole mini-batch before it computes the normaliser (``learner/steps.py``).

Weighting the advantage of PPO's clipped ratio pi / pi_old by pi_old / mu is the decoupled
PPO objective (AReaL): the trust region is around the proximal policy, the correction is
for the behaviour policy, so stale samples are trained without the clip range having to
cover their staleness.

Sources: F. Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training" (2025; truncated IS at token level); verl's rollout correction (levels token /
sequence / geometric, modes truncate / mask); W. Fu et al., "AReaL: A Large-Scale
Asynchronous Reinforcement Learning System for Language Reasoning" (2025; decoupled PPO).
Deviation: the summed log-ratio is capped at `LOG_RATIO_CAP` before exp (only overflow is
guarded: a weight that large is truncated or masked anyway).

Shapes: ``logprobs``, ``behaviour_logprobs``, ``mask`` Float[Array, "B T"]; weights [B, T]
(0 where ``mask`` is 0).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

from jaxrl_llm.algorithms.masked import compute_dtype, masked_max, masked_mean

IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "mask")
LOG_RATIO_CAP = 20.0  # exp(20) ~ 4.9e8, beyond any sensible cap


def importance_weights(
    logprobs: Array,
    behaviour_logprobs: Array,
    mask: Array,
    *,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 2.0,
    floor: float = 0.0,
) -> tuple[Array, dict[str, Array]]:
    """The corrected weights [B, T] (see the module docstring) and their metrics over the
    trained tokens: `is/weight/mean` and `is/weight/max` of the raw weights, and
    `is/clipped_frac`, the share of tokens whose weight was truncated or (mask mode)
    rejected, i.e. outside [floor, cap]."""
    if mode not in IS_MODES:
        raise ValueError(f"importance sampling mode {mode!r}: expected one of {IS_MODES}")
    w, m = _raw_weights(logprobs, behaviour_logprobs, mask, level, cap, floor)
    if mode == "truncate":
        out, clipped = jnp.minimum(w, cap), w > cap
    else:
        kept = (w >= floor) & (w <= cap)
        out, clipped = jnp.where(kept, w, 0.0), ~kept
    metrics = {
        "is/weight/mean": masked_mean(w, m),
        "is/weight/max": masked_max(w, m),
        "is/clipped_frac": masked_mean(clipped.astype(m.dtype), m),
    }
    return out * m, metrics


def rejection_mask(
    logprobs: Array,
    behaviour_logprobs: Array,
    mask: Array,
    *,
    level: str = "token",
    cap: float = 2.0,
    floor: float = 0.0,
) -> Array:
    """``mask`` without the tokens (or, at the sequence and geometric levels, the whole
    sequences) whose raw weight lies outside [floor, cap]: the mask mode's rejection, as
    verl's rollout rejection removes them from ``response_mask``. Shapes [..., T] -> the
    same, in ``mask``'s dtype."""
    w, _ = _raw_weights(logprobs, behaviour_logprobs, mask, level, cap, floor)
    mask = jnp.asarray(mask)
    return jnp.where((w >= floor) & (w <= cap), mask, jnp.zeros_like(mask))


def _raw_weights(
    logprobs: Array, behaviour_logprobs: Array, mask: Array, level: str, cap: float, floor: float
) -> tuple[Array, Array]:
    """The raw weights w [..., T] of ``level`` and the mask in their dtype."""
    if level not in IS_LEVELS:
        raise ValueError(f"importance sampling level {level!r}: expected one of {IS_LEVELS}")
    if not 0 <= floor <= cap:
        raise ValueError(f"importance weight bounds need 0 <= floor <= cap, got {floor}, {cap}")
    dtype = compute_dtype(logprobs, behaviour_logprobs)
    m = jnp.asarray(mask).astype(dtype)
    log_r = (logprobs.astype(dtype) - behaviour_logprobs.astype(dtype)) * m
    if level != "token":
        total = log_r.sum(-1, keepdims=True)
        if level == "geometric":
            total = total / jnp.maximum(m.sum(-1, keepdims=True), 1.0)
        log_r = jnp.broadcast_to(total, log_r.shape)
    return jnp.exp(jnp.minimum(log_r, LOG_RATIO_CAP)), m

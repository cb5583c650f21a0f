"""Advantage estimators: GRPO (and Dr.GRPO), RLOO, REINFORCE++ (and its baseline), GAE.

Shape legend: B batch (prompts x G, groups consecutive: rows ``[g*G, (g+1)*G)`` are the G
samples of prompt g), G group size, T response tokens.

The public functions take the arrays each method needs. Their registered adapters (names as in
verl's ``AdvantageEstimator``: ``grpo``, ``rloo``, ``reinforce_plus_plus``,
``reinforce_plus_plus_baseline``, ``gae``) share one token-level call,
``fn(token_rewards[B, T], response_mask[B, T], *, values=None, **hparams)
-> (advantages[B, T], returns[B, T])``, so the learner can switch method by name; each is
registered with what it needs from the run (a critic, a minimum group size).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

from jaxrl_llm.algorithms.masked import compute_dtype, masked_whiten
from jaxrl_llm.algorithms.registry import register


def _grouped(rewards: Array, group_size: int) -> Array:
    """``rewards[B]`` as ``[B // G, G]`` in float32 (or wider); checks B % G at trace time."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be [B], got shape {rewards.shape}")
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"batch {rewards.shape[0]} is not a whole number of groups of size {group_size}"
        )
    return rewards.astype(compute_dtype(rewards)).reshape(-1, group_size)


def _group_offsets(grouped: Array) -> Array:
    """``grouped[g, i] - grouped[g, 0]`` [B // G, G]: each group measured from its first
    sample. Its mean and std are those of ``grouped`` in exact arithmetic, and a group of
    equal rewards gives exact zeros, where the float32 mean of G equal values such as 0.7
    can miss the value by a rounding that ``/ (std + eps)`` would then magnify to 0.1."""
    return grouped - grouped[:, :1]


def grpo_advantages(
    rewards: Array, group_size: int, *, eps: float = 1e-6, norm_by_std: bool = True
) -> Array:
    """GRPO group-normalised advantages, one per sample.

    Formula: ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` over the G samples of prompt g,
    with the unbiased std (``ddof=1``, torch.std's default). ``norm_by_std=False`` gives
    Dr.GRPO: ``A_i = r_i - mean_g(r)``.

    Source: DeepSeekMath (Shao et al. 2024, arXiv:2402.03300) §4.1.2; Dr.GRPO (Liu et al. 2025,
    arXiv:2503.20783). Semantics of verl ``compute_grpo_outcome_advantage`` (eps 1e-6).

    Shapes: ``rewards`` Float[Array, "B"] with B = prompts x G, groups consecutive;
    returns Float[Array, "B"] (float32 or wider).

    Deviations: a group of one sample gets advantage 0 (verl uses mean 0, std 1, i.e. the raw
    reward; a lone sample has no baseline to be compared against). The paper's std is not
    specified as biased or unbiased; verl, TRL and Tunix use unbiased. The mean and std are
    taken of the offsets from the group's first reward (``_group_offsets``; the same in exact
    arithmetic), so a group of equal rewards gets exactly 0, where verl's float32 can give
    up to 0.1 (16 x 0.7).
    """
    grouped = _grouped(rewards, group_size)
    if group_size == 1:
        return jnp.zeros(grouped.shape[0], grouped.dtype)
    offsets = _group_offsets(grouped)
    centred = offsets - offsets.mean(axis=1, keepdims=True)
    if norm_by_std:
        centred = centred / (offsets.std(axis=1, ddof=1, keepdims=True) + eps)
    return centred.reshape(-1)


def rloo_advantages(rewards: Array, group_size: int) -> Array:
    """REINFORCE leave-one-out advantages, one per sample.

    Formula: ``A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_g(r))``.

    Source: Kool et al. 2019 ("Buy 4 REINFORCE samples, get a baseline for free");
    Ahmadian et al. 2024 (arXiv:2402.14740). Semantics of verl ``compute_rloo_outcome_advantage``.

    Shapes: ``rewards`` Float[Array, "B"], groups consecutive; returns Float[Array, "B"].

    Deviations: a group of one sample gets 0 (verl leaves the raw reward there); the mean is
    taken of the offsets from the group's first reward (``_group_offsets``), so a group of
    equal rewards gets exactly 0.
    """
    grouped = _grouped(rewards, group_size)
    if group_size == 1:
        return jnp.zeros(grouped.shape[0], grouped.dtype)
    offsets = _group_offsets(grouped)
    centred = offsets - offsets.mean(axis=1, keepdims=True)
    return (centred * (group_size / (group_size - 1))).reshape(-1)


def _time_major(*xs: Array) -> tuple[Array, ...]:
    return tuple(jnp.swapaxes(x, 0, 1) for x in xs)


def reinforce_pp_advantages(
    token_rewards: Array,
    response_mask: Array,
    *,
    gamma: float = 1.0,
    baseline_group_size: int | None = None,
) -> tuple[Array, Array]:
    """REINFORCE++ advantages, or its group-baseline variant.

    Plain (``baseline_group_size=None``): discounted return-to-go over response tokens,
    ``G_t = r_t + gamma * G_{t+1}`` (t running over unmasked tokens), then whitened over all
    response tokens of the batch: ``A = masked_whiten(G)``.

    Baseline variant (``baseline_group_size=G``): the sequence score ``s_i = sum_t r_{i,t}`` minus
    its group mean, put on every response token, then whitened over the batch's response tokens;
    returns equal advantages (verl's convention). The group mean is taken of the offsets from
    the group's first score (``_group_offsets``), so an equal group is exactly 0 before the
    whitening, which would otherwise blow its rounding up to about +-1.

    Source: Hu 2025, REINFORCE++ (arXiv:2501.03262). Semantics of verl
    ``compute_reinforce_plus_plus_outcome_advantage`` and
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``.

    Shapes: ``token_rewards``, ``response_mask`` Float[Array, "B T"]; returns
    ``(advantages, returns)``, both Float[Array, "B T"], zero outside the mask.

    Deviation: verl resets the running return at every masked token, which cuts a response with
    masked tool output in the middle in two (tokens before the tool output would not see the
    outcome reward). Here masked tokens are skipped: the return is carried through them
    undiscounted. For right-padded masks without holes both agree.
    """
    dtype = compute_dtype(token_rewards)
    mask = jnp.asarray(response_mask).astype(dtype)
    rewards = token_rewards.astype(dtype) * mask
    if baseline_group_size is not None:
        scores = rewards.sum(axis=-1)
        grouped = _grouped(scores, baseline_group_size)
        if baseline_group_size > 1:  # verl: a lone sample keeps its score (mean 0)
            offsets = _group_offsets(grouped)
            grouped = offsets - offsets.mean(axis=1, keepdims=True)
        adv = masked_whiten(grouped.reshape(-1, 1) * mask, mask) * mask
        return adv, adv

    def step(running: Array, inputs: tuple[Array, Array]) -> tuple[Array, Array]:
        r_t, m_t = inputs
        running = jnp.where(m_t > 0, r_t + gamma * running, running)
        return running, running

    rewards_tm, mask_tm = _time_major(rewards, mask)
    _, returns_tm = jax.lax.scan(
        step, jnp.zeros_like(rewards_tm[0]), (rewards_tm, mask_tm), reverse=True
    )
    returns = jnp.swapaxes(returns_tm, 0, 1) * mask
    return masked_whiten(returns, mask) * mask, returns


def gae_advantages(
    token_rewards: Array,
    values: Array,
    response_mask: Array,
    *,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[Array, Array]:
    """Generalised advantage estimation over response tokens, skipping masked ones.

    Formula, for unmasked t, with t' the next unmasked token after t (V_{t'} = 0, A_{t'} = 0
    past the end): ``delta_t = r_t + gamma * V_{t'} - V_t``, ``A_t = delta_t + gamma * lam *
    A_{t'}``; ``returns_t = A_t + V_t`` (before whitening); then, if ``whiten``,
    ``A = masked_whiten(A, mask)`` (unbiased variance, eps 1e-8 inside the rsqrt).

    Source: Schulman et al. 2016 (arXiv:1506.02438). Semantics of verl
    ``compute_gae_advantage_return``: masked positions (e.g. inserted tool output) carry the
    next value and the running advantage through unchanged, so they are invisible to the
    recursion.

    Shapes: ``token_rewards``, ``values``, ``response_mask`` Float[Array, "B T"]; returns
    ``(advantages, returns)``, both Float[Array, "B T"].

    Deviation: advantages and returns are zeroed outside the mask (verl leaves carried values
    there; every consumer masks them out anyway). Whitening statistics are over the whole batch.
    """
    dtype = compute_dtype(token_rewards, values)
    mask = jnp.asarray(response_mask).astype(dtype)
    rewards_tm, values_tm, mask_tm = _time_major(
        token_rewards.astype(dtype), values.astype(dtype), mask
    )

    def step(carry: tuple[Array, Array], inputs: tuple[Array, Array, Array]):
        next_value, last_gae = carry
        r_t, v_t, m_t = inputs
        gae_t = r_t + gamma * next_value - v_t + gamma * lam * last_gae
        keep = m_t > 0
        next_value = jnp.where(keep, v_t, next_value)
        last_gae = jnp.where(keep, gae_t, last_gae)
        return (next_value, last_gae), last_gae

    zeros = jnp.zeros_like(rewards_tm[0])
    _, adv_tm = jax.lax.scan(step, (zeros, zeros), (rewards_tm, values_tm, mask_tm), reverse=True)
    adv = jnp.swapaxes(adv_tm, 0, 1)
    returns = (adv + values.astype(dtype)) * mask
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv * mask, returns


# ----------------------------------------------------------------------------------------------
# Registered token-level adapters: fn(token_rewards, response_mask, *, values=None, ...).
# Each registration declares what the method needs from the run (`registry.Capabilities`):
# GRPO and RLOO need a group (rollout.n >= 2: a lone sample is its own baseline, advantage
# 0); GAE reads a critic's values. REINFORCE++'s baseline variant keeps a lone sample's
# score (verl), so it runs with n = 1.


def _scores(token_rewards: Array, response_mask: Array) -> Array:
    return (token_rewards * jnp.asarray(response_mask).astype(token_rewards.dtype)).sum(-1)


def _on_tokens(seq_adv: Array, response_mask: Array) -> tuple[Array, Array]:
    adv = seq_adv[:, None] * jnp.asarray(response_mask).astype(seq_adv.dtype)
    return adv, adv


@register("advantage", "grpo", min_group_size=2, group_baseline=True)
def grpo_token_advantages(
    token_rewards: Array,
    response_mask: Array,
    *,
    values: Array | None = None,
    group_size: int,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[Array, Array]:
    """:func:`grpo_advantages` of the summed token rewards, put on every response token."""
    del values
    scores = _scores(token_rewards, response_mask)
    return _on_tokens(
        grpo_advantages(scores, group_size, eps=eps, norm_by_std=norm_by_std), response_mask
    )


@register("advantage", "rloo", min_group_size=2, group_baseline=True)
def rloo_token_advantages(
    token_rewards: Array,
    response_mask: Array,
    *,
    values: Array | None = None,
    group_size: int,
) -> tuple[Array, Array]:
    """:func:`rloo_advantages` of the summed token rewards, put on every response token."""
    del values
    return _on_tokens(
        rloo_advantages(_scores(token_rewards, response_mask), group_size), response_mask
    )


@register("advantage", "reinforce_plus_plus")
def reinforce_pp_token_advantages(
    token_rewards: Array,
    response_mask: Array,
    *,
    values: Array | None = None,
    gamma: float = 1.0,
) -> tuple[Array, Array]:
    """:func:`reinforce_pp_advantages`, plain variant."""
    del values
    return reinforce_pp_advantages(token_rewards, response_mask, gamma=gamma)


@register("advantage", "reinforce_plus_plus_baseline", group_baseline=True)
def reinforce_pp_baseline_token_advantages(
    token_rewards: Array,
    response_mask: Array,
    *,
    values: Array | None = None,
    group_size: int,
) -> tuple[Array, Array]:
    """:func:`reinforce_pp_advantages`, group-baseline variant."""
    del values
    return reinforce_pp_advantages(token_rewards, response_mask, baseline_group_size=group_size)


@register("advantage", "gae", needs_critic=True, reads=("values",))
def gae_token_advantages(
    token_rewards: Array,
    response_mask: Array,
    *,
    values: Array | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[Array, Array]:
    """:func:`gae_advantages`; needs ``values`` from the critic."""
    if values is None:
        raise ValueError("the 'gae' advantage estimator needs values from a critic")
    return gae_advantages(token_rewards, values, response_mask, gamma=gamma, lam=lam, whiten=whiten)

"""Advantage estimators: hand-computed values, numpy loop references, properties."""

import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import jaxrl_llm.algorithms as alg
from jaxrl_llm.algorithms import resolve
from jaxrl_llm.testing import FLOAT32_EPS, float32_sum_tolerance

# under jit: one compile per call instead of one per primitive (keeps the suite fast)
grpo_advantages = jax.jit(alg.grpo_advantages, static_argnums=1, static_argnames="norm_by_std")
rloo_advantages = jax.jit(alg.rloo_advantages, static_argnums=1)
reinforce_pp_advantages = jax.jit(
    alg.reinforce_pp_advantages, static_argnames="baseline_group_size"
)
gae_advantages = jax.jit(alg.gae_advantages, static_argnames="whiten")

TOL = dict(rtol=1e-5, atol=1e-6)


def np_whiten(x, mask):
    """Independent masked whitening: unbiased variance, eps 1e-8 inside the sqrt."""
    v = x[mask > 0].astype(np.float64)
    out = (x - v.mean()) / np.sqrt(v.var(ddof=1) + 1e-8)
    return out * mask


def np_gae(rewards, values, mask, gamma, lam):
    """verl's GAE recursion as a plain Python loop over rows and tokens."""
    adv = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        next_v, last = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                last = rewards[b, t] + gamma * next_v - values[b, t] + gamma * lam * last
                next_v = values[b, t]
            adv[b, t] = last
    return adv * mask, (adv + values) * mask


def gae_tolerance(rewards, values, mask, gamma, lam):
    """Two float32 programs' disagreement on `np_gae`'s advantages: each step's sum of r,
    gamma V', -V, gamma lam A' (5 roundings) plus the next step's bound times gamma lam."""
    tol = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        next_v, last, e = 0.0, 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                terms = [rewards[b, t], gamma * next_v, values[b, t], gamma * lam * last]
                e = float32_sum_tolerance(terms, roundings=5) + gamma * lam * e
                last = rewards[b, t] + gamma * next_v - values[b, t] + gamma * lam * last
                next_v = values[b, t]
            tol[b, t] = e
    return tol * mask


def gae_returns_tolerance(rewards, values, mask, gamma, lam):
    """The bound on |float32 - exact| returns ``A + V`` of `np_gae`, the raw advantages' bound
    (`gae_tolerance`) plus the addition's rounding: no relative bound fits, as A + V cancels
    (|V| ~ 10 gave |returns| ~ 1e-3 in issue #26)."""
    adv, _ = np_gae(rewards, values, mask, gamma, lam)
    e_adv = gae_tolerance(rewards, values, mask, gamma, lam)
    return (e_adv + float32_sum_tolerance([adv, values])) * mask


def whiten_tolerance(x, e_x, mask, whitened):
    """The bound on |float32 - exact| for ``masked_whiten(x, mask) * mask`` (``(x - mean) *
    rsqrt(var + 1e-8)``, unbiased var) from ``x``'s float64 values, the bound ``e_x`` on their
    own float32 error (0 for inputs) and the float64 ``whitened``: the mean errs by the
    inputs' worst error, its sum's and its division's roundings; the centred values by that
    and the subtraction (e_c); the variance by 2 sum|c| e_c and its sum's roundings; the
    scale relatively by half the variance's error and 4 roundings (divisions, sqrt,
    reciprocal, product). First order in eps32."""
    x, mask = np.asarray(x, np.float64), np.asarray(mask, np.float64)
    a, n, e_in = x[mask > 0], mask.sum(), np.max(e_x)
    centred = a - a.mean()
    var = (centred**2).sum() / (n - 1)
    e_mean = e_in + float32_sum_tolerance(a) / n + FLOAT32_EPS * abs(a.mean())
    e_c = e_in + e_mean + FLOAT32_EPS * (np.abs(a) + abs(a.mean())).max()
    e_var = (2 * np.abs(centred).sum() * e_c + float32_sum_tolerance(centred**2)) / (n - 1)
    e_scale = e_var / (2 * var) + 4 * FLOAT32_EPS
    return (e_c / np.sqrt(var) + np.abs(whitened) * e_scale) * mask


def grpo_tolerance(r):
    """The bound on |float32 - exact| for `grpo_advantages` of ``r`` [groups, G] (float64
    values of float32 rewards), per element: each offset from the group's first reward
    d = r - r_0 rounds once (e_d), their mean errs by the mean of e_d and its sum's and
    division's roundings (e_m), each centred value by e_d, e_m and the subtraction (e_c), the
    unbiased variance by 2 sum|c| e_c, its sum's roundings and the division, the std by
    half that over s (at most the root of it when s ~ 0) and the sqrt; then s + 1e-6 and the
    final division round once each. First order in eps32."""
    g = r.shape[1]
    d = r - r[:, :1]
    m = d.mean(1, keepdims=True)
    c = d - m
    var = (c**2).sum(1, keepdims=True) / (g - 1)
    s, eps = np.sqrt(var), FLOAT32_EPS
    e_d = eps * np.abs(d)
    e_m = (float32_sum_tolerance(d, axis=1)[:, None] + e_d.sum(1, keepdims=True)) / g
    e_m = e_m + eps * np.abs(m)
    e_c = e_d + e_m + eps * np.abs(c)
    e_var = (
        2 * (np.abs(c) * e_c).sum(1, keepdims=True) + float32_sum_tolerance(c**2, axis=1)[:, None]
    )
    e_var = e_var / (g - 1) + eps * var
    e_s = np.minimum(e_var / (2 * np.maximum(s, 1e-300)), np.sqrt(e_var)) + eps * s
    d = s + 1e-6
    adv = c / d
    return e_c / d + np.abs(adv) * ((e_s + eps * d) / d + eps)


# ------------------------------------------------------------------------------------------ GRPO


def test_grpo_hand_values():
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    # group 1: mean 0.5, unbiased std sqrt(1/3); group 2 is constant -> 0.
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    expected = [a, -a, -a, a, 0, 0, 0, 0]
    np.testing.assert_allclose(grpo_advantages(rewards, 4), expected, **TOL)


def test_grpo_three_sample_group_and_dr_grpo():
    rewards = jnp.array([1.0, 0.0, 0.0])
    # mean 1/3; unbiased var = ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3.
    s = math.sqrt(1 / 3) + 1e-6
    np.testing.assert_allclose(
        grpo_advantages(rewards, 3), [2 / 3 / s, -1 / 3 / s, -1 / 3 / s], **TOL
    )
    np.testing.assert_allclose(
        grpo_advantages(rewards, 3, norm_by_std=False), [2 / 3, -1 / 3, -1 / 3], **TOL
    )


def test_grpo_single_sample_group_is_zero():
    np.testing.assert_array_equal(grpo_advantages(jnp.array([3.0, -1.0]), 1), [0.0, 0.0])
    np.testing.assert_array_equal(rloo_advantages(jnp.array([3.0, -1.0]), 1), [0.0, 0.0])


def test_grpo_groups_are_consecutive_not_strided():
    # [a, a, b, b] with G=2: each consecutive pair is constant -> all zero.
    np.testing.assert_array_equal(grpo_advantages(jnp.array([1.0, 1.0, 0.0, 0.0]), 2), 0.0)


def test_grpo_rejects_partial_groups():
    with pytest.raises(ValueError, match="whole number of groups"):
        grpo_advantages(jnp.zeros(5), 2)


@settings(max_examples=20, deadline=None)
@given(
    groups=st.sampled_from([1, 3]),
    group_size=st.sampled_from([2, 3, 8]),
    seed=st.integers(0, 2**31 - 1),
)
def test_grpo_group_properties(groups, group_size, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=groups * group_size).astype(np.float32)
    adv = np.asarray(grpo_advantages(jnp.asarray(rewards), group_size)).reshape(groups, group_size)
    r = rewards.reshape(groups, group_size).astype(np.float64)
    s = r.std(axis=1, ddof=1)
    # Mean zero up to float32 rounding: the mean of the offsets d = r - r_0 errs by at most
    # n eps max|d|, divided by s + eps, then n advantages are summed; a fixed atol of 1e-5
    # failed 7 of 9,000 random groups (close rewards: small s); this bound held on 9,000
    # with err / bound <= 0.03.
    n, eps32 = group_size, np.finfo(np.float32).eps
    d = np.abs(r - r[:, :1]).max(axis=1)
    bound = 4 * n * eps32 * (d / (s + 1e-6) + np.abs(adv).max(axis=1))
    assert np.all(np.abs(adv.astype(np.float64).mean(axis=1)) <= bound)
    # The std (in float64) of advantages each within e of the exact ones is within
    # ||e|| / sqrt(n - 1) of the exact advantages' std, s / (s + 1e-6): a seminorm.
    e_std = np.sqrt((grpo_tolerance(r) ** 2).sum(1) / (n - 1))
    assert np.all(np.abs(adv.astype(np.float64).std(axis=1, ddof=1) - s / (s + 1e-6)) <= e_std)
    # order within a group is preserved
    assert np.all(np.sign(np.diff(adv, axis=1)) == np.sign(np.diff(r, axis=1)))


def test_grpo_against_numpy_loop():
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 2, size=24).astype(np.float32)
    expected = np.zeros(24)
    for g in range(6):  # explicit per-group loop, as verl's index bookkeeping does
        grp = rewards[g * 4 : (g + 1) * 4].astype(np.float64)
        expected[g * 4 : (g + 1) * 4] = (grp - grp.mean()) / (grp.std(ddof=1) + 1e-6)
    # Integer rewards, groups of 4: the sums, the mean and the centred rewards are exact in
    # float32; the variance's divide, the sqrt, the + 1e-6 and the final divide round at
    # most 6 times, within 4 eps32 of |A| (tests/learner/test_experience.py's overlong test).
    got = np.asarray(grpo_advantages(jnp.asarray(rewards), 4), np.float64)
    np.testing.assert_array_less(np.abs(got - expected), 4 * FLOAT32_EPS * np.abs(expected) + 1e-30)


# ------------------------------------------------------------------------------------------ RLOO


def test_rloo_hand_values():
    # r_i - mean of the other three
    np.testing.assert_allclose(
        rloo_advantages(jnp.array([1.0, 0.0, 0.0, 1.0]), 4), [2 / 3, -2 / 3, -2 / 3, 2 / 3], **TOL
    )
    np.testing.assert_allclose(rloo_advantages(jnp.array([2.0, 0.0]), 2), [2.0, -2.0], **TOL)


# ------------------------------------------------------------------------------------ REINFORCE++


def test_reinforce_pp_hand_values():
    rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    np.testing.assert_allclose(ret, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]], **TOL)
    np.testing.assert_allclose(adv, np_whiten(np.asarray(ret), np.asarray(mask)), **TOL)


def test_reinforce_pp_skips_masked_tokens_in_the_middle():
    # token 1 is tool output: its "reward" is ignored and the return is carried through it
    rewards = jnp.array([[0.0, 7.0, 1.0]])
    mask = jnp.array([[1.0, 0.0, 1.0]])
    _, ret = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    np.testing.assert_allclose(ret, [[0.5, 0.0, 1.0]], **TOL)


def test_reinforce_pp_baseline_hand_values():
    rewards = jnp.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    adv, ret = reinforce_pp_advantages(rewards, mask, baseline_group_size=2)
    # scores [1, 0, 1, 1]; minus group means [0.5, 0.5, 1, 1] -> [0.5, -0.5, 0, 0] on tokens
    centred = np.array([[0.5, 0.5], [-0.5, 0.0], [0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(adv, np_whiten(centred, np.asarray(mask)), **TOL)
    np.testing.assert_array_equal(adv, ret)


# ------------------------------------------------------------------------------------------- GAE


def test_gae_hand_values_no_whiten():
    rewards = jnp.array([[0.0, 0.0, 1.0]])
    values = jnp.array([[0.5, 0.4, 0.3]])
    mask = jnp.ones((1, 3))
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    # A2 = 1 - 0.3 = 0.7; A1 = (0.9*0.3 - 0.4) + 0.72*0.7 = 0.374;
    # A0 = (0.9*0.4 - 0.5) + 0.72*0.374 = 0.12928
    np.testing.assert_allclose(adv, [[0.12928, 0.374, 0.7]], **TOL)
    np.testing.assert_allclose(ret, [[0.62928, 0.774, 1.0]], **TOL)


def test_gae_skips_masked_tool_tokens():
    # same response with a masked tool-output token inserted at position 1
    rewards = jnp.array([[0.0, 5.0, 0.0, 1.0]])
    values = jnp.array([[0.5, 9.0, 0.4, 0.3]])
    mask = jnp.array([[1.0, 0.0, 1.0, 1.0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    np.testing.assert_allclose(adv, [[0.12928, 0.0, 0.374, 0.7]], **TOL)
    np.testing.assert_allclose(ret, [[0.62928, 0.0, 0.774, 1.0]], **TOL)


def test_gae_returns_before_whitening_and_masked_whitening():
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(4, 9)).astype(np.float32)
    values = rng.normal(size=(4, 9)).astype(np.float32)
    mask = (rng.random((4, 9)) < 0.7).astype(np.float32)
    mask[:, 0] = 1
    ref_adv, ref_ret = np_gae(rewards, values, mask, 0.99, 0.95)
    adv, ret = gae_advantages(
        jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma=0.99, lam=0.95
    )
    r64, v64 = rewards.astype(np.float64), values.astype(np.float64)
    e_raw = gae_tolerance(r64, v64, mask, 0.99, 0.95)
    e_ret = gae_returns_tolerance(r64, v64, mask, 0.99, 0.95)
    want = np_whiten(ref_adv, mask)
    e_adv = whiten_tolerance(ref_adv, e_raw, mask, want)
    assert max(e_ret.max(), e_adv.max()) < 1e-4  # rounding, far below a bug's size
    np.testing.assert_array_less(np.abs(np.asarray(ret, np.float64) - ref_ret), e_ret + 1e-30)
    np.testing.assert_array_less(np.abs(np.asarray(adv, np.float64) - want), e_adv + 1e-30)
    # Taken in float64, the mean and std of values each within e_adv of exactly whitened
    # ones (mean 0, std sqrt(var / (var + 1e-8))) are within mean(e_adv) and ||e_adv|| /
    # sqrt(n - 1) of those.
    on = mask > 0
    whitened, e, n = np.asarray(adv, np.float64)[on], e_adv[on], on.sum()
    assert abs(whitened.mean()) <= e.mean()
    assert abs(whitened.std(ddof=1) - want[on].std(ddof=1)) <= np.sqrt((e**2).sum() / (n - 1))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0))
def test_gae_matches_loop_and_ignores_padding(seed, gamma, lam):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(3, 6)).astype(np.float32)
    values = rng.normal(size=(3, 6)).astype(np.float32)
    mask = (rng.random((3, 6)) < 0.6).astype(np.float32)
    _, ref_ret = np_gae(rewards, values, mask, gamma, lam)
    adv, ret = gae_advantages(
        jnp.asarray(rewards),
        jnp.asarray(values),
        jnp.asarray(mask),
        gamma=gamma,
        lam=lam,
        whiten=False,
    )
    e_ret = gae_returns_tolerance(rewards.astype(np.float64), values.astype(np.float64), mask,
                                  gamma, lam)  # fmt: skip
    assert e_ret.max() < 1e-4
    np.testing.assert_array_less(np.abs(np.asarray(ret, np.float64) - ref_ret), e_ret + 1e-30)
    # extra right padding (garbage rewards and values under mask 0) changes nothing
    pad = lambda x, v: np.concatenate([x, np.full((3, 2), v, np.float32)], axis=1)
    adv_p, ret_p = gae_advantages(
        jnp.asarray(pad(rewards, 3.0)),
        jnp.asarray(pad(values, -2.0)),
        jnp.asarray(pad(mask, 0)),
        gamma=gamma,
        lam=lam,
        whiten=False,
    )
    # two float32 programs (other shapes): within the recursion's rounding bound
    tol = gae_tolerance(rewards.astype(np.float64), values.astype(np.float64), mask, gamma, lam)
    assert tol.max() < 1e-4
    err = np.abs(np.asarray(adv_p[:, :6], np.float64) - np.asarray(adv, np.float64))
    np.testing.assert_array_less(err, tol + 1e-30)
    np.testing.assert_array_equal(ret_p[:, 6:], 0.0)


# -------------------------------------------------------------------------------------- registry


def test_registered_token_level_adapters():
    token_rewards = jnp.array([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 0.0]])
    mask = jnp.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    adv, ret = jax.jit(resolve("advantage", "grpo", group_size=2))(token_rewards, mask)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    b = 1.0 / (math.sqrt(2.0) + 1e-6)
    np.testing.assert_allclose(adv, [[a, a], [-a, -a], [-b, 0], [b, 0]], **TOL)
    np.testing.assert_array_equal(adv, ret)
    adv, _ = jax.jit(resolve("advantage", "rloo", group_size=2))(token_rewards, mask)
    np.testing.assert_allclose(adv, [[1, 1], [-1, -1], [-2, 0], [2, 0]], **TOL)
    values = jnp.zeros_like(token_rewards)
    adv, ret = jax.jit(resolve("advantage", "gae", gamma=1.0, lam=1.0, whiten=False))(
        token_rewards, mask, values=values
    )
    np.testing.assert_allclose(ret, [[1, 1], [0, 0], [0, 0], [2, 0]], **TOL)
    with pytest.raises(ValueError, match="needs values"):
        resolve("advantage", "gae")(token_rewards, mask)

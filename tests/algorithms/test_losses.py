"""Policy and value losses: hand values, clipping regimes, gradient signs, properties."""

import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import jaxrl_llm.algorithms as alg
from jaxrl_llm.algorithms import loss_normalizer, resolve
from jaxrl_llm.testing import FLOAT32_EPS, aggregation_weights, float32_sum_tolerance

# Values are checked under jit: one compile per test instead of one per primitive (fast suite).
# Eager execution of the same code is covered by test_verl_parity.py.
aggregate_loss = jax.jit(alg.aggregate_loss, static_argnames="mode")
policy_loss = jax.jit(alg.policy_loss, static_argnames=("agg", "dual_clip_c"))
gspo_policy_loss = jax.jit(alg.gspo_policy_loss, static_argnames="agg")
value_loss = jax.jit(alg.value_loss, static_argnames=("agg", "clip"))

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# five tokens covering the PPO regimes: (advantage, ratio)
ADV = jnp.array([[1.0, 1.0, -1.0, -1.0, -1.0]])
RATIO = np.array([[1.5, 0.5, 1.5, 0.5, 5.0]])
OLD = jnp.array([[-1.0, -2.0, -0.5, -1.5, -3.0]])
LOGP = OLD + jnp.log(jnp.asarray(RATIO))
MASK = jnp.ones((1, 5))


def test_ppo_hand_values_and_metrics():
    # per token: max(-A r, -A clip(r, 0.8, 1.2)) = [-1.2, -0.5, 1.5, 0.8, 5.0]
    loss, m = policy_loss(LOGP, OLD, ADV, MASK)
    np.testing.assert_allclose(loss, (-1.2 - 0.5 + 1.5 + 0.8 + 5.0) / 5, rtol=1e-5)
    np.testing.assert_allclose(m["pg_clipfrac"], 2 / 5)  # tokens 0 and 3
    assert float(m["pg_clipfrac_lower"]) == 0.0
    ppo_kl = -(2 * math.log(1.5) + 2 * math.log(0.5) + math.log(5.0)) / 5
    np.testing.assert_allclose(m["ppo_kl"], ppo_kl, rtol=1e-5)


def test_dual_clip_only_for_negative_advantages():
    # token 4 (A < 0, r = 5): min(5, 3) = 3
    loss, m = policy_loss(LOGP, OLD, ADV, MASK, dual_clip_c=3.0)
    np.testing.assert_allclose(loss, (-1.2 - 0.5 + 1.5 + 0.8 + 3.0) / 5, rtol=1e-5)
    np.testing.assert_allclose(m["pg_clipfrac_lower"], 1 / 5)
    # a positive advantage with a huge ratio is not dual-clipped (it is clipped at 1 + eps)
    loss, m = policy_loss(
        jnp.log(jnp.array([[5.0]])),
        jnp.zeros((1, 1)),
        jnp.ones((1, 1)),
        jnp.ones((1, 1)),
        dual_clip_c=3.0,
    )
    np.testing.assert_allclose(loss, -1.2, rtol=1e-6)
    assert float(m["pg_clipfrac_lower"]) == 0.0
    with pytest.raises(ValueError, match="> 1"):
        policy_loss(LOGP, OLD, ADV, MASK, dual_clip_c=0.5)


def test_clip_higher():
    logp, old = jnp.log(jnp.array([[1.25]])), jnp.zeros((1, 1))
    one = jnp.ones((1, 1))
    np.testing.assert_allclose(policy_loss(logp, old, one, one)[0], -1.2, rtol=1e-6)
    np.testing.assert_allclose(
        policy_loss(logp, old, one, one, clip_high=0.28)[0], -1.25, rtol=1e-6
    )


def test_log_ratio_clamp_keeps_loss_finite():
    loss, m = policy_loss(
        jnp.array([[0.0]]), jnp.array([[-100.0]]), -jnp.ones((1, 1)), jnp.ones((1, 1))
    )
    np.testing.assert_allclose(loss, math.exp(20.0), rtol=1e-5)
    np.testing.assert_allclose(m["ppo_kl"], -20.0)


def test_gradient_signs():
    grad = jax.grad(lambda lp: policy_loss(lp, OLD, ADV, MASK, dual_clip_c=3.0)[0])(LOGP)
    g = np.asarray(grad)[0]
    assert g[0] == 0.0  # A > 0, ratio above 1 + eps: clipped, no gradient
    assert g[1] < 0  # A > 0 inside the trust region: raise logp
    assert g[2] > 0  # A < 0, ratio 1.5 (unclipped): lower logp
    assert g[3] == 0.0  # A < 0, ratio below 1 - eps: clipped
    assert g[4] == 0.0  # dual-clipped
    np.testing.assert_allclose(g[1], -1.0 * 0.5 / 5, rtol=1e-5)  # -A * r / N
    np.testing.assert_allclose(g[2], 1.0 * 1.5 / 5, rtol=1e-5)


@pytest.mark.slow  # 5 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(MODES))
def test_ratio_one_gives_minus_aggregated_advantage(seed, mode):
    rng = np.random.default_rng(seed)
    logp = jnp.asarray(rng.normal(size=(4, 6)).astype(np.float32))
    adv = jnp.asarray(rng.normal(size=(4, 6)).astype(np.float32))
    mask = jnp.asarray((rng.random((4, 6)) < 0.7).astype(np.float32))
    expected = -aggregate_loss(adv, mask, mode)
    # Each token's loss is -A exactly (ratio 1); the programs differ in summation order only.
    tol = float32_sum_tolerance((aggregation_weights(mask, mode) * np.asarray(adv)).ravel(),
                                roundings=adv.size - 1 + 3)  # fmt: skip
    assert tol < 1e-4  # rounding only; an aggregation bug (1e-3 or more) still fails
    for fn in (policy_loss, gspo_policy_loss):
        loss, m = fn(logp, logp, adv, mask, agg=mode)
        np.testing.assert_allclose(loss, expected, rtol=0, atol=tol)
        assert float(m["pg_clipfrac"]) == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_extra_padding_changes_nothing(mode):
    rng = np.random.default_rng(3)
    old = rng.normal(size=(3, 4)).astype(np.float32)
    logp = old + rng.normal(size=(3, 4)).astype(np.float32) * 0.3
    adv = rng.normal(size=(3, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0]], np.float32)
    base, _ = policy_loss(*map(jnp.asarray, (logp, old, adv, mask)), agg=mode, scale_factor=4.0)
    pad = lambda x, v: np.pad(x, ((0, 2), (0, 3)), constant_values=v)  # rows and columns
    padded, _ = policy_loss(
        *map(jnp.asarray, (pad(logp, 9.0), pad(old, -9.0), pad(adv, 5.0), pad(mask, 0.0))),
        agg=mode,
        scale_factor=4.0,
    )
    # Two float32 programs (other shapes): each token's loss errs by its log ratio's
    # rounding, exp's 2 eps and the product's (the clip bounds 0.8 and 1.2 round once);
    # then the aggregation sums them in another order (`float32_sum_tolerance`).
    lr = logp.astype(np.float64) - old.astype(np.float64)
    a, rho = adv.astype(np.float64), np.exp(lr)
    token = np.maximum(-a * rho, -a * np.clip(rho, 0.8, 1.2))
    w = aggregation_weights(mask, mode, scale_factor=4.0)
    e_token = np.abs(a) * np.maximum(rho, 1.2) * FLOAT32_EPS * (np.abs(lr) + 4)
    tol = float32_sum_tolerance((w * token).ravel(), roundings=w.size - 1 + 3)
    tol += (np.abs(w) * e_token).sum()
    assert abs(float(padded) - float(base)) <= tol, (float(padded), float(base), tol)


@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_accumulation_equals_full_batch(mode):
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(8, 6, 3)).astype(np.float32))
    w = jnp.asarray(rng.normal(size=3).astype(np.float32))
    old = jax.nn.log_sigmoid(x @ w) + 0.05 * jnp.asarray(rng.normal(size=(8, 6)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=(8,)).astype(np.float32))  # per sequence, broadcast
    mask = jnp.asarray((rng.random((8, 6)) < 0.7).astype(np.float32))

    def loss_fn(w, x, old, adv, mask, normalizer=None):
        logp = jax.nn.log_sigmoid(x @ w)
        return policy_loss(logp, old, adv, mask, agg=mode, normalizer=normalizer)[0]

    @jax.jit  # one compile: the full batch and four micro-batches of two sequences
    def full_and_accumulated(w):
        grad_fn = jax.grad(loss_fn)
        norm = loss_normalizer(mask, mode)
        micro = [
            grad_fn(w, x[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], norm)
            for i in range(0, 8, 2)
        ]
        return grad_fn(w, x, old, adv, mask), sum(micro)

    full, acc = full_and_accumulated(w)
    # Two float32 programs (summation orders), so a bound from the terms: every ratio sits
    # inside the clip range (both programs take the unclipped gradient), where token t adds
    # c_t A_t rho_t sigma(-z_t) x_t, z = x . w (c: aggregation weights). Its value rounds 6
    # times; rho and sigma(-z) carry a relative error (units of u) of the log-ratio's abs
    # error (log_sigmoid 2 ulp of |logp|, the subtraction, z's 3 roundings of |x| . |w|), of
    # exp's 0.7 ulp and of sigma(-z) = exp(-z - softplus(-z)); the sum: n - 1 roundings.
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    z, logp = x64 @ w64, -np.logaddexp(0, -(x64 @ w64))
    log_ratio = logp - np.asarray(old, np.float64)
    on = np.asarray(mask) > 0
    assert np.all(np.abs(np.abs(log_ratio[on]) - np.log1p(0.2 * np.sign(log_ratio[on]))) > 1e-3)
    c = aggregation_weights(mask, mode) * np.asarray(adv, np.float64)[:, None]
    terms = (c * np.exp(log_ratio) * np.exp(logp - z))[..., None] * x64  # sigma(-z) = p e^-z
    rel = 5 * np.abs(logp) + np.abs(log_ratio) + np.abs(z) + 6 * np.abs(x64) @ np.abs(w64) + 8
    n = c.size
    tol = float32_sum_tolerance(terms.reshape(n, 3), roundings=n - 1 + 6)
    tol += FLOAT32_EPS * (np.abs(terms) * rel[..., None]).reshape(n, 3).sum(0)
    with jax.enable_x64(True):
        f64 = lambda a: jnp.asarray(np.asarray(a, np.float64))
        exact = np.asarray(jax.grad(loss_fn)(*map(f64, (w, x, old, adv, mask))))
    assert tol.max() < 1e-4  # far below a bug's size (1e-3)
    for got, want in ((acc, full), (acc, exact), (full, exact)):
        np.testing.assert_array_less(np.abs(np.asarray(got, np.float64) - want), tol)


def test_gspo_hand_values_and_gradient():
    old = jnp.zeros((2, 2))
    logp = jnp.array([[0.1, 0.3], [-0.1, 5.0]])  # row 1, token 1 is masked
    adv = jnp.array([1.0, -1.0])
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    # row 0: s = e^0.2 = 1.2214 > 1.2 -> -1.2 per token; row 1: s = e^-0.1, inside the clip
    s1 = math.exp(-0.1)
    fn = lambda lp: gspo_policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    (loss, m), grad = jax.value_and_grad(fn, has_aux=True)(logp)
    np.testing.assert_allclose(loss, (-1.2 + s1) / 2, rtol=1e-6)
    np.testing.assert_allclose(m["pg_clipfrac"], 2 / 3, rtol=1e-6)
    # d/dlogp of -A * s over seq-mean-token-mean weights 1 / (n_b * S)
    np.testing.assert_allclose(grad, [[0.0, 0.0], [s1 / 2, 0.0]], rtol=1e-6, atol=1e-7)


def test_gspo_is_registered_with_paper_defaults():
    fn = jax.jit(resolve("policy_loss", "gspo"))
    # ratio e^0.001 is outside [1 - 3e-4, 1 + 4e-4]: clipped for A > 0
    loss, m = fn(jnp.full((1, 2), 0.001), jnp.zeros((1, 2)), jnp.ones((1,)), jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, -(1 + 4e-4), rtol=1e-6)
    assert float(m["pg_clipfrac"]) == 1.0


def test_value_loss_hand_values():
    values = jnp.array([[1.0, 2.0]])
    old = jnp.array([[0.5, 2.1]])
    returns = jnp.array([[2.0, 1.0]])
    # token 0: max((1-2)^2, (0.7-2)^2) = 1.69 (clipped); token 1: max(1, 1) = 1
    loss, m = value_loss(values, old, returns, jnp.ones((1, 2)), clip=0.2)
    np.testing.assert_allclose(loss, 0.5 * (1.69 + 1.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(m["vf_clipfrac"], 0.5)
    loss, m = value_loss(values, old, returns, jnp.ones((1, 2)), clip=None)
    np.testing.assert_allclose(loss, 0.5 * (1.0 + 1.0) / 2, rtol=1e-6)


def test_value_loss_gradient_signs():
    old = jnp.zeros((1, 3))
    values = jnp.array([[0.1, -0.1, 0.5]])
    returns = jnp.array([[1.0, -1.0, 1.0]])
    g = jax.grad(lambda v: value_loss(v, old, returns, jnp.ones((1, 3)), clip=0.2)[0])(values)
    g = np.asarray(g)[0]
    assert g[0] < 0 and g[1] > 0  # move toward the return
    # token 2: the clipped error (0.2 - 1)^2 is larger; the clipped value has no gradient
    assert g[2] == 0.0

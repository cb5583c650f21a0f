"""KL estimators: hand values, clamps, signs, gradients; the adaptive coefficient."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.algorithms as alg
from jaxrl_llm.algorithms import adaptive_kl_coef

kl_penalty = jax.jit(alg.kl_penalty, static_argnames="kind")  # one compile per call site

LOGP = jnp.array([[math.log(0.5), math.log(0.25)]])
REF = jnp.array([[math.log(0.25), math.log(0.25)]])


@pytest.mark.parametrize(
    ("kind", "first"),
    [
        ("k1", math.log(2)),
        ("kl", math.log(2)),
        ("abs", math.log(2)),
        ("k2", 0.5 * math.log(2) ** 2),
        ("mse", 0.5 * math.log(2) ** 2),
        ("k3", 0.5 + math.log(0.5) * -1 - 1),  # r = ref/p = 0.5: r - log r - 1
        ("low_var_kl", 0.5 - math.log(0.5) - 1),
    ],
)
def test_hand_values(kind, first):
    np.testing.assert_allclose(kl_penalty(LOGP, REF, kind), [[first, 0.0]], rtol=1e-6, atol=1e-7)


def test_abs_and_k1_sign():
    np.testing.assert_allclose(kl_penalty(REF, LOGP, "k1"), [[-math.log(2), 0.0]], rtol=1e-6)
    np.testing.assert_allclose(kl_penalty(REF, LOGP, "abs"), [[math.log(2), 0.0]], rtol=1e-6)


def test_k3_clamps():
    logp = jnp.array([0.0, 0.0, 0.0])
    ref = jnp.array([-30.0, 30.0, -12.0])
    # d = ref - logp clipped to [-20, 20]; exp(-20) + 20 - 1 = 19 -> clipped to 10;
    # exp(20) - 21 -> 10; d = -12: exp(-12) + 11 = 11.000006 -> 10.
    np.testing.assert_allclose(kl_penalty(logp, ref, "k3"), [10.0, 10.0, 10.0])
    ref = jnp.array([-2.0])
    np.testing.assert_allclose(kl_penalty(jnp.zeros(1), ref, "k3"), [math.exp(-2) + 1], rtol=1e-6)
    g = jax.grad(lambda lp: kl_penalty(lp, jnp.array([30.0]), "k3").sum())(jnp.array([0.0]))
    assert np.all(np.isfinite(g))


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3"])
def test_gradient_pushes_policy_toward_reference(kind):
    # policy above the reference: minimising the penalty lowers logp (gradient > 0)
    g = jax.grad(lambda lp: kl_penalty(lp, jnp.array([-1.0]), kind).sum())(jnp.array([-0.5]))
    assert float(g[0]) > 0
    if kind != "k1":  # and below it: raises logp
        g = jax.grad(lambda lp: kl_penalty(lp, jnp.array([-1.0]), kind).sum())(jnp.array([-1.5]))
        assert float(g[0]) < 0


def test_nonnegative_estimators():
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.normal(size=(4, 16)) * 3) for _ in range(2))
    for kind in ("abs", "k2", "k3"):
        assert float(kl_penalty(a, b, kind).min()) >= 0.0
    np.testing.assert_array_equal(kl_penalty(a, a, "k3"), 0.0)


@pytest.mark.parametrize("scale", [1e-8, 1e-4, 1e-3, 1e-2])
def test_k3_near_the_reference_is_nonnegative_and_accurate(scale):
    """A policy close to its reference (the first updates after the copy): d = ref - logp of
    ~`scale`. k3 = exp(d) - d - 1 ~ d^2 / 2 must stay >= 0 and its mean accurate; written
    as exp(d) - d - 1 in float32 it cancelled to noise of ~eps (at 1e-4: 152 of 65,536 tokens
    negative, the mean -7.8e-11 against +5.0e-9). Bound: a few float32 ulps of each term
    (expm1(d) and d are each rounded once: ~eps |d| per token, averaged), relative to the
    float64 mean of exp(d) - d - 1."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(16, 4096)) * 3.0 - 5.0
    logp = ref - rng.normal(size=ref.shape) * scale
    ref32, logp32 = (jnp.asarray(x, jnp.float32) for x in (ref, logp))
    got = np.asarray(kl_penalty(logp32, ref32, "k3"), np.float64)
    d = np.asarray(ref32, np.float64) - np.asarray(logp32, np.float64)  # what float32 holds
    exact = np.expm1(d) - d  # float64: exact to ~1e-16 relative for these d
    assert got.min() >= 0.0
    eps = float(np.finfo(np.float32).eps)
    # ref - logp is exact in float32 (Sterbenz: the two are within a factor of 2).
    bound = (4 * eps * np.abs(d)).mean()
    assert abs(got.mean() - exact.mean()) <= bound, (got.mean(), exact.mean(), bound)


def test_unknown_kind_lists_choices():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "k4")


def test_adaptive_kl_coef():
    # error = clip(0.3 / 0.1 - 1, -0.2, 0.2) = 0.2 -> 0.1 * (1 + 0.2 * 10 / 100)
    np.testing.assert_allclose(
        adaptive_kl_coef(0.1, 0.3, 10, target_kl=0.1, horizon=100), 0.1 * 1.02, rtol=1e-6
    )
    np.testing.assert_allclose(
        adaptive_kl_coef(0.1, 0.09, 10, target_kl=0.1, horizon=100), 0.1 * (1 - 0.01), rtol=1e-5
    )

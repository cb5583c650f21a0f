"""The adaptive KL controller of the KL in the reward (`AlgoConfig.kl_in_reward_target`,
verl's `kl_ctrl.type = 'adaptive'`): the experience pass takes the coefficient as an
argument, the loop moves it by `algorithms.adaptive_kl_coef` after each step, and a
checkpoint carries it (the end-to-end check: `test_rl_loop.py`'s PPO run)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.algorithms import adaptive_kl_coef
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.experience import advantage_fn, make_experience_fn
from jaxrl_llm.learner.rl_config import AlgoConfig, RLConfig
from jaxrl_llm.learner.rl_loop import adapt_kl_coef
from jaxrl_llm.models import ModelConfig
from jaxrl_llm.models.init import init_model
from jaxrl_llm.testing import FLOAT32_EPS

B, T, G = 4, 6, 2


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    loss = np.zeros((B, T), np.float32)
    loss[:, 2:] = 1.0
    old, ref, values = (jnp.asarray(rng.normal(size=(B, T)), jnp.float32) for _ in range(3))
    scores = jnp.asarray(rng.integers(0, 2, B), jnp.float32)
    return scores, jnp.asarray(loss), old, ref, values


def test_the_coefficient_argument_replaces_the_configured_one():
    algo = AlgoConfig(estimator="gae", kl_in_reward_coef=0.05)
    fn = advantage_fn(algo, G)
    x = _inputs()
    # The configured value passed as the argument: the same numbers, bit for bit.
    for got, want in zip(fn(*x, kl_coef=jnp.float32(0.05)), fn(*x)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Another value: the rewards move by the difference times the KL (k1 = old - ref).
    shaped = np.asarray(fn(*x, kl_coef=jnp.float32(0.25))[2], np.float64)
    base = np.asarray(fn(*x)[2], np.float64)
    _, loss, old, ref, _ = (np.asarray(a, np.float64) for a in x)
    kl = (old - ref) * loss
    # Each float32 reward is score - fl(coef * kl), rounded twice: within an ulp of each
    # product and of each result.
    tol = 2 * FLOAT32_EPS * (0.3 * np.abs(kl) + np.abs(shaped) + np.abs(base)) + 1e-30
    np.testing.assert_array_less(np.abs(shaped - base + (0.25 - 0.05) * kl), tol)


def test_the_loop_moves_the_coefficient_by_verls_rule():
    adaptive = AlgoConfig(kl_in_reward_coef=0.1, kl_in_reward_target=0.1,
                          kl_in_reward_horizon=1000.0)  # fmt: skip
    got = adapt_kl_coef(adaptive, 0.1, 0.3, 64)
    # KL 3x the target: the error clipped to +0.2, times 64 samples of a 1000-sample horizon.
    assert got == pytest.approx(0.1 * (1 + 0.2 * 64 / 1000), rel=1e-6)
    assert got == float(adaptive_kl_coef(0.1, 0.3, 64, target_kl=0.1, horizon=1000.0))


def test_a_target_without_a_kl_in_the_reward_is_refused():
    cfg = dataclasses.replace(RLConfig(), algo=AlgoConfig(kl_in_reward_target=0.1))
    with pytest.raises(ConfigError, match=r"kl_in_reward_target adapts kl_in_reward_coef"):
        cfg.validate()
    with pytest.raises(ConfigError, match=r"kl_in_reward_target"):
        AlgoConfig(kl_in_reward_coef=0.1, kl_in_reward_target=0.0)


@pytest.mark.slow  # measured: 6.4 s (fast tier, AMD EPYC, 2026-12-06)
def test_the_experience_pass_reports_the_coefficient_it_used():
    cfg = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8)  # fmt: skip
    graphdef, params = nnx.split(init_model(cfg, seed=0))
    algo = AlgoConfig(estimator="grpo", kl_in_reward_coef=0.05)
    fn = make_experience_fn(graphdef, None, algo, temperature=1.0, group_size=G, micro_batch=B)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 32, (B, T)), jnp.int32)
    scores, loss, *_ = _inputs()
    _, _, m = fn(params, params, None, ids, loss, loss, scores, jnp.zeros((B, T)),
                 kl_coef=jnp.float32(0.125))  # fmt: skip
    assert float(m["actor/reward_kl_penalty_coeff"]) == 0.125
    assert float(m["actor/reward_kl_penalty"]) == 0.0  # the reference is the policy

"""Reward shaping: outcome on the last response token, KL in the reward."""

import math

import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_llm.algorithms as alg

outcome_token_rewards = jax.jit(alg.outcome_token_rewards)
kl_shaped_rewards = jax.jit(alg.kl_shaped_rewards, static_argnames="kind")


def test_outcome_on_last_response_token():
    mask = jnp.array(
        [
            [1, 1, 1, 0, 0],  # right padded
            [1, 0, 0, 1, 0],  # tool output (masked) in the middle
            [1, 1, 0, 0, 0],  # ends in masked tool output + padding
            [0, 0, 0, 0, 0],  # empty
            [1, 1, 1, 1, 1],  # full
        ]
    )
    got = outcome_token_rewards(jnp.array([1.0, 2.0, 3.0, 4.0, 5.0]), mask)
    expected = np.zeros((5, 5))
    expected[0, 2], expected[1, 3], expected[2, 1], expected[4, 4] = 1, 2, 3, 5
    np.testing.assert_array_equal(got, expected)


def test_kl_in_reward_hand_values_and_mask():
    mask = jnp.array([[1.0, 0.0, 1.0]])  # token 1 is tool output
    scores = outcome_token_rewards(jnp.array([1.0]), mask)
    logp = jnp.array([[math.log(0.5), -9.0, math.log(0.5)]])
    ref = jnp.array([[math.log(0.25), 0.0, math.log(0.5)]])
    got = kl_shaped_rewards(scores, logp, ref, mask, kl_coef=0.1)  # k1
    np.testing.assert_allclose(got, [[-0.1 * math.log(2), 0.0, 1.0]], rtol=1e-6)
    got = kl_shaped_rewards(scores, logp, ref, mask, kl_coef=0.1, kind="k3")
    np.testing.assert_allclose(got, [[-0.1 * (0.5 + math.log(2) - 1), 0.0, 1.0]], rtol=1e-6)

"""A group whose samples all scored the same has no signal: its advantage is exactly 0 for
every group estimator, whatever the score (an all-correct group under math 1.0 + format 0.1
scores 1.1 everywhere, which float32 cannot average back to itself)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.algorithms as alg
from jaxrl_llm.algorithms.advantages import reinforce_pp_advantages

SCORES = (0.1, 0.7, 0.9, 1.1, -0.3, 1e3 + 0.1)
SIZES = (2, 5, 7, 8, 16)


def _equal_groups(G):
    """One group per score in SCORES, each G samples of that score: [len(SCORES) * G]."""
    return jnp.asarray(np.repeat(np.asarray(SCORES, np.float32), G))


@pytest.mark.parametrize("G", SIZES)
@pytest.mark.parametrize("norm_by_std", [True, False], ids=["grpo", "dr_grpo"])
def test_grpo_gives_equal_groups_zero(G, norm_by_std):
    fn = jax.jit(alg.grpo_advantages, static_argnums=1, static_argnames="norm_by_std")
    np.testing.assert_array_equal(fn(_equal_groups(G), G, norm_by_std=norm_by_std), 0.0)


@pytest.mark.parametrize("G", SIZES)
def test_rloo_gives_equal_groups_zero(G):
    np.testing.assert_array_equal(
        jax.jit(alg.rloo_advantages, static_argnums=1)(_equal_groups(G), G), 0.0
    )


@pytest.mark.parametrize("G", SIZES)
def test_reinforce_pp_baseline_gives_equal_groups_zero(G):
    """Its group baseline then the batch whitening: were the centred scores rounding noise,
    the whitening would blow them up to about +-1."""
    scores = _equal_groups(G)
    T = 3
    token_rewards = jnp.zeros((scores.shape[0], T)).at[:, -1].set(scores)
    mask = jnp.ones((scores.shape[0], T))
    adv, _ = jax.jit(reinforce_pp_advantages, static_argnames="baseline_group_size")(
        token_rewards, mask, baseline_group_size=G
    )
    np.testing.assert_array_equal(adv, 0.0)

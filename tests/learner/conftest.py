"""Fixtures shared by the learner tests."""

import jax
import pytest

from jaxrl_llm.models import ValueModel, init_model
from jaxrl_llm.testing import tiny_config


@pytest.fixture(scope="module")
def models():
    """(policy, reference, critic) of the tiny config, three different random inits."""
    cfg = tiny_config()
    policy, ref = init_model(cfg, seed=1), init_model(cfg, seed=2)
    critic = init_model(cfg, seed=3, cls=ValueModel)
    # A zero-initialised value head gives zero values; make them count.
    critic.score.set_value(jax.random.normal(jax.random.PRNGKey(0), critic.score.shape))
    return policy, ref, critic

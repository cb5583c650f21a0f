"""Registry: lookup by name, clear errors, keyword validation at resolve time, and the
capabilities registered with each function (what the config asks instead of the name)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.algorithms import available, lookup, policy_loss, register, registry, resolve


def test_expected_names_are_registered():
    assert set(available("advantage")) == {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
    }
    assert {"vanilla", "ppo", "gspo"} <= set(available("policy_loss"))
    assert {"k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"} == set(available("kl"))
    assert lookup("policy_loss", "vanilla") is policy_loss


def test_unknown_name_lists_the_options():
    with pytest.raises(ValueError, match=r"unknown advantage 'grp0'; choose one of: gae, grpo"):
        resolve("advantage", "grp0")
    with pytest.raises(ValueError, match="kinds are: advantage, policy_loss, kl, loss_agg"):
        available("advantages")


def test_unknown_keyword_fails_at_resolve_time():
    with pytest.raises(ValueError, match=r"does not take clip_ratio; it takes: .*clip_high"):
        resolve("policy_loss", "vanilla", clip_ratio=0.2)


def test_resolve_binds_hyperparameters():
    fn = jax.jit(resolve("policy_loss", "ppo", clip_high=0.28))
    one = jnp.ones((1, 1))
    loss, _ = fn(jnp.log(1.25 * one), 0 * one, one, one)
    np.testing.assert_allclose(loss, -1.25, rtol=1e-6)


def test_double_registration_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register("kl", "k1")(lambda a, b: a - b)
    # re-registering the same function under its name is harmless
    register("kl", "k1")(lookup("kl", "k1"))


def test_register_a_new_option_then_remove_it():
    @register("kl", "zero_for_test")
    def zero(logprobs, ref_logprobs):
        return jnp.zeros_like(logprobs)

    try:
        assert "zero_for_test" in available("kl")
        np.testing.assert_array_equal(resolve("kl", "zero_for_test")(one := jnp.ones(2), one), 0.0)
    finally:
        registry.unregister("kl", "zero_for_test")
    assert "zero_for_test" not in available("kl")


def test_resolve_declared_binds_only_the_options_each_function_takes():
    options = dict(group_size=2, norm_by_std=False, gamma=0.5, lam=0.9)
    grpo = registry.resolve_declared("advantage", "grpo", **options)
    assert grpo.keywords == {"group_size": 2, "norm_by_std": False}
    gae = registry.resolve_declared("advantage", "gae", **options)
    assert gae.keywords == {"gamma": 0.5, "lam": 0.9}
    assert registry.resolve_declared("advantage", "rloo", **options).keywords == {"group_size": 2}
    gspo = registry.resolve_declared("policy_loss", "gspo", clip_low=0.1, dual_clip_c=3.0)
    assert gspo.keywords == {"clip_low": 0.1}
    with pytest.raises(ValueError, match="unknown advantage 'grp0'"):
        registry.resolve_declared("advantage", "grp0", **options)


def test_builtin_estimators_declare_what_they_need():
    table = {
        name: (caps.needs_critic, caps.min_group_size, caps.reads)
        for name in available("advantage")
        for caps in [registry.capabilities("advantage", name)]
    }
    assert table == {
        "gae": (True, 1, ("values",)),
        "grpo": (False, 2, ()),
        "rloo": (False, 2, ()),
        "reinforce_plus_plus": (False, 1, ()),
        "reinforce_plus_plus_baseline": (False, 1, ()),
    }
    assert registry.capabilities("policy_loss", "gspo").paper_clip == (3e-4, 4e-4)
    assert registry.capabilities("policy_loss", "ppo").paper_clip is None
    with pytest.raises(ValueError, match="unknown advantage 'grp0'"):
        registry.capabilities("advantage", "grp0")


def test_capabilities_are_checked_at_registration():
    with pytest.raises(ValueError, match=r"reads=\['values'\] but takes no such input"):
        register("advantage", "no_values_for_test", reads=("values",))(lambda r, m: (r, r))
    with pytest.raises(TypeError, match="needs_critc"):
        register("advantage", "typo_for_test", needs_critc=True)
    gae = lookup("advantage", "gae")
    with pytest.raises(ValueError, match="already registered"):
        register("advantage", "gae")(gae)  # same function, other capabilities
    assert "no_values_for_test" not in available("advantage")


@pytest.fixture
def critic_estimator():
    """A temporary estimator that reads a critic's values and needs groups of 4."""

    @register(
        "advantage", "critic_for_test", needs_critic=True, min_group_size=4, reads=("values",)
    )
    def centred_values(token_rewards, response_mask, *, values=None):
        adv = (token_rewards - values) * response_mask
        return adv, adv

    yield "critic_for_test"
    registry.unregister("advantage", "critic_for_test")


def test_a_new_estimator_that_needs_a_critic_gets_one(critic_estimator):
    from jaxrl_llm.learner.rl_config import AlgoConfig, RLConfig, RolloutConfig

    cfg = RLConfig(algo=AlgoConfig(estimator=critic_estimator), rollout=RolloutConfig(n=4))
    assert cfg.uses_critic
    cfg.validate()
    assert not RLConfig(algo=AlgoConfig(estimator="grpo")).uses_critic
    assert RLConfig(algo=AlgoConfig(estimator="gae")).uses_critic


def test_the_registered_min_group_size_is_enforced(critic_estimator):
    from jaxrl_llm.learner.rl_config import AlgoConfig, RLConfig, RolloutConfig

    few = RLConfig(algo=AlgoConfig(estimator=critic_estimator), rollout=RolloutConfig(n=2))
    with pytest.raises(
        ValueError, match=r"estimator 'critic_for_test' needs rollout.n >= 4 .* rollout.n = 2"
    ):
        few.validate()
    lone = RLConfig(algo=AlgoConfig(estimator="rloo"), rollout=RolloutConfig(n=1))
    with pytest.raises(ValueError, match=r"estimator 'rloo' needs rollout.n >= 2"):
        lone.validate()
    RLConfig(
        algo=AlgoConfig(estimator="reinforce_plus_plus"), rollout=RolloutConfig(n=1)
    ).validate()

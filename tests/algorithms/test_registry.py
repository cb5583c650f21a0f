"""Registry: lookup by name, clear errors, keyword validation at resolve time."""

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
        del registry._TABLES["kl"]["zero_for_test"]


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

"""`TrainState.create` lays every leaf out on the parameters' mesh; `apply_gradients`' metrics
say what the update did."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.learner.optim import OptimConfig, make_optimizer
from jaxrl_llm.learner.state import TrainState, apply_gradients
from jaxrl_llm.models import init_model
from jaxrl_llm.sharding import TRAIN_RULES, build_mesh
from jaxrl_llm.testing import tiny_config

CFG = tiny_config()


@pytest.mark.parametrize("key", [jax.random.PRNGKey, jax.random.key])
def test_moments_follow_their_parameters_and_scalars_are_replicated(key):
    mesh = build_mesh(1, 4, 2)
    params = nnx.state(init_model(CFG, seed=0, mesh=mesh, rules=TRAIN_RULES))
    state = TrainState.create(params, make_optimizer(OptimConfig(lr=1e-3), 10), key(0))
    specs: dict = {}
    for x in jax.tree.leaves(params):
        specs.setdefault(x.shape, set()).add(x.sharding.spec)
    for x in jax.tree.leaves(state.opt_state):
        assert isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        if x.ndim:  # Adam's moments: sharded exactly like the parameter they track
            assert x.sharding.spec in specs[x.shape], x.shape
    for x in (state.step, state.rng):
        assert x.sharding.mesh == mesh and x.sharding.spec == PartitionSpec()


def test_update_norm_is_what_the_parameters_moved_and_zero_when_skipped():
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.ones(4)}
    tx = make_optimizer(OptimConfig(lr=1e-2, max_grad_norm=0.5), 10)
    state = TrainState.create(params, tx, jax.random.PRNGKey(0))
    grads = jax.tree.map(lambda p: 0.3 * p + 0.1, params)
    new, m = jax.jit(lambda s, g: apply_gradients(s, g, tx))(state, grads)
    moved = np.sqrt(sum(np.sum((np.asarray(new.params[k]) - np.asarray(params[k])) ** 2)
                        for k in params))  # fmt: skip
    updates, _ = tx.update(grads, state.opt_state, params)  # optax's own update, unjitted
    np.testing.assert_allclose(float(m["update_norm"]), moved, rtol=1e-6)
    np.testing.assert_allclose(float(m["update_norm"]), float(optax.tree.norm(updates)), rtol=1e-4)
    np.testing.assert_allclose(float(m["grad_norm"]), float(optax.tree.norm(grads)), rtol=1e-6)
    bad = jax.tree.map(lambda g: g.at[0].set(jnp.nan), grads)
    same, m = jax.jit(lambda s, g: apply_gradients(s, g, tx))(state, bad)
    assert float(m["skipped"]) == 1.0 and float(m["update_norm"]) == 0.0 and int(same.step) == 0

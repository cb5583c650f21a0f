"""`TrainState.create` lays every leaf out on the parameters' mesh."""

import jax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.learner.optim import OptimConfig, make_optimizer
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.models import init_model
from jaxrl_llm.sharding import TRAIN_RULES, build_mesh
from jaxrl_llm.testing import tiny_config

CFG = tiny_config()


@pytest.mark.slow  # 23 s in a loaded 2-worker run, AMD EPYC AVX2
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_accumulation_traces_the_loss_once_and_sums_it_in_float32(dtype):
    """The scan's body is the loss's only trace (the accumulators come from the params,
    not from a second trace of the model), and a narrower loss is summed in float32:
    micro-batch losses 256, 1, 1, 1 sum to 259 in float32, to 256 in bfloat16 (its spacing
    at 256 is 2). The gradients, summed in the params' dtype, are small integers: exact."""
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_llm.learner.state import accumulate_gradients

    traces = []
    params = {"w": jnp.asarray([256.0, 1.0, 0.0], dtype)}
    xs = jnp.asarray([[1, 0, 0], [0, 1, 0], [0, 1, 0], [0, 1, 0]], dtype)  # 4 micro-batches

    def loss_fn(p, x):
        traces.append(x.shape)
        return jnp.sum(p["w"] * x), x.sum()

    loss, grads, aux = jax.jit(lambda p, x: accumulate_gradients(loss_fn, p, x))(params, xs)
    assert traces == [(3,)]
    assert loss.dtype == jnp.float32 and grads["w"].dtype == jnp.dtype(dtype)
    assert float(loss) == 259.0
    np.testing.assert_array_equal(np.asarray(grads["w"], np.float32), [1.0, 3.0, 0.0])
    np.testing.assert_array_equal(np.asarray(aux, np.float32), [1.0, 1.0, 1.0, 1.0])

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

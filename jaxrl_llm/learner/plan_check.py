"""The planner's check: XLA's memory analysis of the real jitted policy step (and of a reward
model's scoring forward), compiled from abstract inputs on a mesh (nothing is allocated).
`tests/learner/test_plan.py`, `test_plan_rewards.py` and `test_lora.py` hold the plan to it;
`plan_activations.ACTIVATION_COUNTS` and `plan_rewards.SCORING_COUNTS` were fitted to it."""

from __future__ import annotations

from jaxrl_llm.learner.plan import Workload
from jaxrl_llm.sharding.rules import TRAIN_RULES


def xla_step_bytes(cfg, mesh, w: Workload, algo=None, optim=None) -> dict[str, int]:
    """XLA's memory analysis of the real jitted `make_policy_step` on `mesh`'s backend,
    compiled from abstract inputs (nothing is allocated). `total` = arguments + outputs -
    aliased (donated) + temporaries: the step's live bytes per device (with `w.lora`, the
    LoRA step: adapters trained, the frozen base an argument)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxrl_llm.learner.compile_ahead import abstract_micro_batches
    from jaxrl_llm.learner.optim import OptimConfig, make_optimizer
    from jaxrl_llm.learner.rl_config import AlgoConfig
    from jaxrl_llm.learner.state import TrainState
    from jaxrl_llm.learner.steps import make_policy_step
    from jaxrl_llm.models import CausalLM
    from jaxrl_llm.models.lora import apply_lora
    from jaxrl_llm.sharding.rules import ShardingContext, state_shardings

    ctx = ShardingContext(mesh, TRAIN_RULES)

    def build():
        model = CausalLM(cfg, rngs=nnx.Rngs(0), sharding=ctx)
        if w.lora is not None:
            apply_lora(model, w.lora, seed=0)
        return model

    def placed(state):
        shardings = state_shardings(state, mesh, TRAIN_RULES)
        return jax.tree.map(
            lambda v, s: v.replace(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s.get_value())),
            state,
            shardings,
            is_leaf=lambda x: isinstance(x, nnx.Variable),
        )

    # LoRA: the step trains the adapters; the frozen base is its extra argument.
    graphdef, params, *frozen = nnx.split(
        nnx.eval_shape(build), *((nnx.LoRAParam, ...) if w.lora is not None else ())
    )
    params, frozen = placed(params), [placed(f) for f in frozen]
    tx = make_optimizer(optim or OptimConfig(), 10)
    state = jax.eval_shape(lambda p: TrainState.create(p, tx, jax.random.PRNGKey(0)), params)
    repl = NamedSharding(mesh, PartitionSpec())
    opt_state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=repl) if x.ndim == 0 else x,
        state.opt_state,
    )
    state = TrainState(
        jax.ShapeDtypeStruct((), jnp.int32, sharding=repl),
        params,
        opt_state,
        jax.ShapeDtypeStruct(state.rng.shape, state.rng.dtype, sharding=repl),
    )
    shape = (w.micro_batches, w.micro_batch, w.seq_len)
    batch = abstract_micro_batches(mesh, shape, jnp.float32)  # as the run lays it out
    step = make_policy_step(graphdef, tx, algo or AlgoConfig(), 1.0)
    ma = step.lower(state, batch, None, *frozen).compile().memory_analysis()
    if ma is None:
        raise RuntimeError(f"the {jax.default_backend()} backend reports no memory analysis")
    out = {
        "arguments": ma.argument_size_in_bytes,
        "outputs": ma.output_size_in_bytes,
        "aliased": ma.alias_size_in_bytes,
        "temp": ma.temp_size_in_bytes,
    }
    out["total"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temp"]
    return out


def xla_rm_forward_bytes(cfg, mesh, rows: int, length: int) -> dict[str, int]:
    """XLA's memory analysis of a reward model's scoring forward (`rewards.model`'s packed
    forward, the `ValueModel` in the training layout, its inputs replicated as the host's
    arrays arrive) over [rows, length] on `mesh`, compiled from abstract inputs."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxrl_llm.models import ValueModel
    from jaxrl_llm.rewards.model import packed_scores
    from jaxrl_llm.sharding.rules import ShardingContext, state_shardings

    ctx = ShardingContext(mesh, TRAIN_RULES)
    abstract = nnx.eval_shape(lambda: ValueModel(cfg, rngs=nnx.Rngs(0), sharding=ctx))
    graphdef, state = nnx.split(abstract)
    state = jax.tree.map(
        lambda v, s: v.replace(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s.get_value())),
        state,
        state_shardings(state, mesh, TRAIN_RULES),
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    host = NamedSharding(mesh, PartitionSpec())
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=host)
    forward = jax.jit(lambda s, *a: packed_scores(nnx.merge(graphdef, s), *a))
    tokens = ints(rows, length)
    ma = forward.lower(state, tokens, tokens, tokens, ints(rows)).compile().memory_analysis()
    if ma is None:
        raise RuntimeError(f"the {jax.default_backend()} backend reports no memory analysis")
    return {"arguments": ma.argument_size_in_bytes, "temp": ma.temp_size_in_bytes}

"""Create models straight into their target sharding (no full copy on one device)."""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.transformer import CausalLM, ValueModel
from jaxrl_llm.sharding.rules import TRAIN_RULES, Rules, ShardingContext, state_shardings


def init_model(
    cfg: ModelConfig,
    *,
    seed: int = 0,
    mesh: Mesh | None = None,
    rules: Rules = TRAIN_RULES,
    cls: type[CausalLM] | type[ValueModel] = CausalLM,
) -> CausalLM | ValueModel:
    """A randomly initialised model; with a mesh, each parameter is born sharded.

    Initialisation runs under `jax.jit` with the parameters' NamedShardings as
    `out_shardings`, so every device materialises only its own shard.
    """
    ctx = ShardingContext(mesh, rules) if mesh is not None else None
    if mesh is None:
        return cls(cfg, rngs=nnx.Rngs(seed))

    abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(seed), sharding=ctx))
    graphdef, abstract_state = nnx.split(abstract)
    shardings = state_shardings(abstract_state, mesh, rules)

    def make():
        return nnx.state(cls(cfg, rngs=nnx.Rngs(seed), sharding=ctx))

    state = jax.jit(make, out_shardings=shardings)()
    return nnx.merge(graphdef, state)

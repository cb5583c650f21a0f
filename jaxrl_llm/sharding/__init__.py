"""Logical axis names, rule tables, mesh building, multi-host init and resharding."""

from jaxrl_llm.sharding import hosts
from jaxrl_llm.sharding.mesh import build_mesh, initialize_distributed, resolve_mesh_shape
from jaxrl_llm.sharding.reshard import already_placed, reshard, target_shardings
from jaxrl_llm.sharding.rules import (
    SAMPLE_RULES,
    TRAIN_RULES,
    ShardingContext,
    constrain,
    logical_sharding,
    logical_to_spec,
    state_shardings,
    state_specs,
)

__all__ = [
    "SAMPLE_RULES",
    "TRAIN_RULES",
    "ShardingContext",
    "already_placed",
    "build_mesh",
    "constrain",
    "hosts",
    "initialize_distributed",
    "logical_sharding",
    "logical_to_spec",
    "reshard",
    "resolve_mesh_shape",
    "state_shardings",
    "state_specs",
    "target_shardings",
]

"""Move a parameter tree between layouts (e.g. training FSDP x TP -> sampling TP)."""

from __future__ import annotations

import functools
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from jaxrl_llm.sharding.rules import Rules, state_shardings


def target_shardings(state: Any, mesh: Mesh, rules: Rules) -> Any:
    """Plain pytree of NamedShardings (no Variable wrappers) for an nnx State."""
    return jax.tree.map(
        lambda v: v.get_value(),
        state_shardings(state, mesh, rules),
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )


def abstract(tree: Any) -> Any:
    """Each jax.Array of `tree` as its shape, dtype and sharding (what a program compiled
    for it depends on); any other leaf as it is (a lowering reads its value's type)."""
    spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return jax.tree.map(lambda x: spec(x) if isinstance(x, jax.Array) else x, tree)


def already_placed(tree: Any, shardings: Any) -> bool:
    leaves, shard_leaves = jax.tree.leaves(tree), jax.tree.leaves(shardings)
    return all(
        isinstance(x, jax.Array) and x.sharding.is_equivalent_to(s, x.ndim)
        for x, s in zip(leaves, shard_leaves, strict=True)
    )


@functools.cache
def _identity(shardings_treedef, shardings_leaves):
    shardings = jax.tree.unflatten(shardings_treedef, shardings_leaves)
    return jax.jit(lambda t: t, out_shardings=shardings)


def reshard(tree: Any, shardings: Any) -> Any:
    """`tree` laid out as `shardings`.

    Returns `tree` itself (zero bytes moved) when every leaf is already there; otherwise
    one jitted identity with `out_shardings`, compiled once per layout pair.
    """
    if already_placed(tree, shardings):
        return tree
    leaves, treedef = jax.tree.flatten(shardings)
    return _identity(treedef, tuple(leaves))(tree)

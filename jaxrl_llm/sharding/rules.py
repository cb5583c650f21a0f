"""Logical-to-mesh rule tables and the functions that apply them.

Two tables: `TRAIN_RULES` (FSDP x TP: weights split over `fsdp` along `embed` and over
`tensor` along heads/mlp/vocab; the batch over `data` x `fsdp`) and `SAMPLE_RULES` (TP only:
weights split over `tensor`, replicated over `data` and `fsdp`; decode slots over
`data` x `fsdp`).

A logical axis maps to a mesh axis only when the dimension divides evenly; otherwise that
dimension is replicated. E.g. Qwen2.5-1.5B has 2 KV heads: on `tensor=4` its K/V
projections are replicated over `tensor` instead of failing (MaxText does the same).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.sharding import axes as ax

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]

_COMMON: Rules = (
    (ax.SEQ, None),
    (ax.CACHE_SEQ, None),
    (ax.LAYERS, None),
    (ax.HEAD_DIM, None),
    (ax.VOCAB, "tensor"),
    (ax.HEADS, "tensor"),
    (ax.KV_HEADS, "tensor"),
    (ax.MLP, "tensor"),
    (ax.ACT_EMBED, None),
    (ax.ACT_HEADS, "tensor"),
    (ax.ACT_KV_HEADS, "tensor"),
    (ax.ACT_MLP, "tensor"),
    (ax.ACT_VOCAB, "tensor"),
)
TRAIN_RULES: Rules = (*_COMMON, (ax.BATCH, ("data", "fsdp")), (ax.EMBED, "fsdp"))
SAMPLE_RULES: Rules = (*_COMMON, (ax.BATCH, ("data", "fsdp")), (ax.EMBED, None))


def logical_to_spec(
    logical: Sequence[str | None],
    rules: Rules,
    mesh: Mesh,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """Map logical axis names to a PartitionSpec under `rules` on `mesh`.

    A mesh axis is used at most once; mesh axes of size 1 are omitted; a dimension that
    the mesh axes do not divide is left whole (replicated).
    """
    table = dict(rules)
    used: set[str] = set()
    out: list[MeshAxes] = []
    for i, name in enumerate(logical):
        if name is not None and name not in table:
            raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
        target = table.get(name) if name is not None else None
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n not in used and mesh.shape.get(n, 1) > 1)
        # Keep the longest prefix of mesh axes that divides the dimension.
        while (
            shape is not None and names and shape[i] % int(np.prod([mesh.shape[n] for n in names]))
        ):
            names = names[:-1]
        used.update(names)
        out.append(None if not names else names[0] if len(names) == 1 else names)
    while out and out[-1] is None:
        out.pop()
    return PartitionSpec(*out)


def logical_sharding(
    logical: Sequence[str | None], rules: Rules, mesh: Mesh, shape: Sequence[int] | None = None
) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(logical, rules, mesh, shape))


def _logical_axes(var: nnx.Variable) -> tuple[str | None, ...]:
    names = var.get_metadata().get("logical_axes")
    if names is None:
        raise ValueError(f"parameter of shape {var.shape} has no logical_axes metadata")
    return tuple(names)


def state_shardings(state: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedSharding for every Variable in an nnx State (abstract or concrete)."""

    def one(var):
        return var.replace(logical_sharding(_logical_axes(var), rules, mesh, var.shape))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def state_specs(state: Any, mesh: Mesh, rules: Rules) -> dict[str, list]:
    """Flat {'path/to/param': spec-as-list} for golden snapshots and logs."""
    out = {}
    for path, var in nnx.to_flat_state(state):
        spec = logical_to_spec(_logical_axes(var), rules, mesh, var.shape)
        out["/".join(map(str, path))] = [list(p) if isinstance(p, tuple) else p for p in spec]
    return out


@dataclasses.dataclass(frozen=True)
class ShardingContext:
    """A mesh and a rule table, held by a model as static (hashable) configuration.

    Being part of the model's graph definition, a change of context re-traces jitted
    functions instead of silently reusing a trace made under other rules.
    """

    mesh: Mesh
    rules: Rules

    def spec(self, logical: Sequence[str | None], shape: Sequence[int] | None = None):
        return logical_to_spec(logical, self.rules, self.mesh, shape)

    def sharding(self, logical: Sequence[str | None], shape: Sequence[int] | None = None):
        return NamedSharding(self.mesh, self.spec(logical, shape))


def constrain(x: jax.Array, logical: Sequence[str | None], ctx: ShardingContext | None):
    """with_sharding_constraint by logical names; without a context there is no mesh."""
    if ctx is None:
        return x
    return jax.lax.with_sharding_constraint(x, ctx.sharding(logical, x.shape))

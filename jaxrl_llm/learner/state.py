"""`TrainState`: the one pytree a train step takes and returns.

A model is split once into its static graph definition (kept outside jit) and its
parameters; the state holds the parameters, the optimiser state, the step and an RNG key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.core import Tracer
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.sharding.hosts import global_array
from jaxrl_llm.types import Leaf


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState(Generic[Leaf]):
    """`Leaf` is `jax.Array`, or `jax.ShapeDtypeStruct` for an abstract state (`plan`)."""

    step: Leaf  # int32 []
    params: Any  # nnx.State of Params
    opt_state: Any
    rng: Leaf  # PRNG key

    @staticmethod
    def create(params: Any, tx: optax.GradientTransformation, rng: jax.Array) -> TrainState:
        # Eagerly: each moment is made like its parameter and keeps that sharding. (Under a
        # bare jit XLA is free to place the zeros anywhere; it puts them on one device.)
        opt_state = tx.init(params)
        state = TrainState(jnp.zeros((), jnp.int32), params, opt_state, rng)
        return _on_params_mesh(state)


def _on_params_mesh(state: TrainState) -> TrainState:
    """Every leaf not already laid out on a mesh (the step, optimiser counters) replicated
    over the parameters' mesh. Multi-host jit and Orbax need global arrays throughout; an
    uncommitted scalar would also come back from a checkpoint pinned to one device."""
    leaves = jax.tree.leaves(state)
    if any(isinstance(x, Tracer) for x in leaves):
        return state  # traced (jit, eval_shape): placement is the caller's out_shardings
    mesh = next(
        (x.sharding.mesh for x in jax.tree.leaves(state.params)
         if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding)),
        None,
    )  # fmt: skip
    if mesh is None:
        return state
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):
        if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding):
            return x
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):  # a typed key: place its raw data
            data = global_array(np.asarray(jax.random.key_data(x)), replicated)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        return global_array(np.asarray(x), replicated)

    return jax.tree.map(place, state)


def apply_gradients(
    state: TrainState, grads: Any, tx: optax.GradientTransformation, loss: jax.Array | None = None
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimiser update, skipped when the loss or any gradient is not finite.

    Returns the new state (the old one, untouched, when skipped) and metrics
    {'grad_norm', 'update_norm', 'skipped'}; a skipped update does not advance `step`.
    """
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm)
    if loss is not None:
        finite &= jnp.isfinite(loss)
    # A non-finite update is computed, then discarded by the select below. (Zeroing the
    # gradients first made XLA:CPU write a copy of each and norm it again for the clip:
    # a fifth more kernels and compile time; docs/performance.md.)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new = dataclasses.replace(state, step=state.step + 1, params=params, opt_state=opt_state)
    new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
    metrics = {
        "grad_norm": grad_norm,
        "update_norm": jnp.where(finite, optax.tree.norm(updates), 0.0),  # what was applied
        "skipped": 1.0 - finite.astype(jnp.float32),
    }
    return new, metrics


def accumulate_gradients(
    loss_fn: Callable[[Any, Any], tuple[jax.Array, Any]],
    params: Any,
    micro_batches: Any,
) -> tuple[jax.Array, Any, Any]:
    """Sum loss and gradients over micro-batches (leading axis M) with `lax.scan`; the aux
    output of `loss_fn` comes back stacked, [M, ...] per leaf, for the caller to reduce.

    `loss_fn(params, micro_batch) -> (loss, aux)` must already be normalised by the whole
    batch (pass a global normaliser), so the sums equal the full-batch loss and gradient.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    # The loss is summed in float32, or wider when the params are (a float64 twin); a
    # bfloat16 loss is widened, not summed in bfloat16.
    loss_dtype = jnp.result_type(jnp.float32, *(p.dtype for p in jax.tree.leaves(params)))

    def body(carry, mb):
        loss_sum, grad_sum = carry
        (loss, aux), grads = grad_fn(params, mb)
        return (loss_sum + loss.astype(loss_dtype), jax.tree.map(jnp.add, grad_sum, grads)), aux

    # Scan over every micro-batch from zero accumulators: one micro-batch's activations
    # live at a time (peeling the first one out let XLA run two at once). A gradient has
    # its parameter's shape and dtype, so the accumulators need no trace of their own (a
    # `jax.eval_shape` of `grad_fn` made tracing the update step take 1.3-1.6x as long).
    init = (jnp.zeros((), loss_dtype), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), aux = jax.lax.scan(body, init, micro_batches)
    return loss, grads, aux


class UpdateStep:
    """`jax.jit(fn, donate_argnums=0)` for an update `fn(state, *args) -> (state, out)` whose
    new state keeps the layout of the state it was given.

    Left to itself, XLA's sharding propagation picks the output layout: on an fsdp mesh it
    shards the replicated [D] norm weights (and their Adam moments) over "fsdp". The next
    call then takes a state of another layout, which is another program: every run compiled
    each update step twice, and the state drifted from the layout its checkpoint, weight
    sync and plan assume. The layout is a static argument, so a state of one layout always
    reuses one program (`cache_size()`); a state with no mesh layout is left unconstrained."""

    def __init__(self, fn: Callable[..., tuple[Any, Any]]):
        def constrained(state, *args, layout):
            new, out = fn(state, *args)
            if layout is not None:
                new = jax.lax.with_sharding_constraint(new, jax.tree.unflatten(*layout))
            return new, out

        self._jitted = jax.jit(constrained, donate_argnums=0, static_argnames="layout")

    def __call__(self, state: Any, *args: Any) -> tuple[Any, Any]:
        return self._jitted(state, *args, layout=_layout(state))

    def lower(self, state: Any, *args: Any):
        return self._jitted.lower(state, *args, layout=_layout(state))

    def cache_size(self) -> int:
        """Programs compiled so far (one per layout and argument shapes)."""
        return self._jitted._cache_size()  # pyright: ignore[reportAttributeAccessIssue] (jax's jit wrapper has it; no public name)


def _layout(state: Any) -> tuple[Any, tuple[NamedSharding, ...]] | None:
    leaves, treedef = jax.tree.flatten(state)
    shardings = tuple(getattr(x, "sharding", None) for x in leaves)
    if not all(isinstance(s, NamedSharding) for s in shardings):
        return None
    return treedef, shardings  # pyright: ignore[reportReturnType] (all NamedSharding, checked)

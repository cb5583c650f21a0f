"""The learner's side of LoRA (`models.lora`): which params are trained, the reference.

With `PolicyConfig.lora` the policy's State splits into the adapters (the `TrainState`'s
params: the only leaves with gradients and optimiser moments, and all a checkpoint holds)
and the frozen base (`Learner.frozen`, passed to the jitted steps beside the state, never
donated or updated). The reference policy for a KL term is the same base with the adapters
zeroed: no second copy of the weights. Without LoRA everything is trained, and the
reference is a copy of the initial params, as before.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_llm.models.lora import LoraConfig, adapters_off, apply_lora


def split_trainable(
    policy: nnx.Module, lora: LoraConfig | None, *, seed: int, reference: bool
) -> tuple[nnx.GraphDef, nnx.State, nnx.State | None, nnx.State | None]:
    """(graphdef, trained params, frozen params or None, reference params or None).

    With `lora`, adapters are attached to `policy` first (in place, so a rollout engine
    built from it runs them); `nnx.merge(graphdef, params, frozen)` rebuilds the policy."""
    if lora is None:
        graphdef, params = nnx.split(policy)
        ref = jax.tree.map(jnp.copy, params) if reference else None
        return graphdef, params, None, ref
    apply_lora(policy, lora, seed=seed)
    graphdef, params, frozen = nnx.split(policy, nnx.LoRAParam, ...)
    ref = nnx.merge_state(adapters_off(params), frozen) if reference else None
    return graphdef, params, frozen, ref


def full_params(params: nnx.State, frozen: nnx.State | None) -> nnx.State:
    """The policy's whole State (same arrays, no copy): `params`, plus `frozen` if given."""
    return params if frozen is None else nnx.merge_state(params, frozen)


def trained_fraction(params: Any, frozen: Any | None) -> float:
    """Trained parameters over all parameters (1.0 without LoRA)."""
    count = lambda t: sum(int(x.size) for x in jax.tree.leaves(t))
    trained = count(params)
    return trained / (trained + (count(frozen) if frozen is not None else 0))

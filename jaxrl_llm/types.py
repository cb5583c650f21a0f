"""Pytrees passed between stages of an RL step.

Shape legend: B batch (prompts x G, groups consecutive), G samples per prompt, T tokens of
a packed sequence (prompt then response, right-padded), M micro-batches.

Token alignment: index t of every per-token array refers to the token `input_ids[:, t]`
as an *action*: its log-probability comes from the logits at t - 1 and its value from the
hidden state at t - 1 (as in verl, where values are read one position before each response
token). Index 0 is never an action.
"""

from __future__ import annotations

import dataclasses

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainBatch:
    """Everything an update step reads. All arrays [B, T] unless noted."""

    input_ids: jax.Array  # int32: prompt + response + padding
    loss_mask: jax.Array  # float32: 1 on model-written response tokens that are trained
    old_logprobs: jax.Array  # float32: trainer's logprobs before the update
    ref_logprobs: jax.Array  # float32: frozen reference model (zeros when unused)
    advantages: jax.Array  # float32
    returns: jax.Array  # float32 (critic targets; advantages for critic-free estimators)
    old_values: jax.Array  # float32 (zeros without a critic)
    rollout_logprobs: jax.Array  # float32: the engine's logprobs (mismatch / TIS)

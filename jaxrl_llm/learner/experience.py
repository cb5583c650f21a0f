"""From rollout completions to a `TrainBatch`: packing, forwards, rewards, advantages.

Host-side packing is numpy; the forwards (old / reference logprobs, values) and the
advantage computation are jitted and take the parameters as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.algorithms import (
    head_logprobs,
    kl_shaped_rewards,
    outcome_token_rewards,
    token_logprobs,
)
from jaxrl_llm.algorithms.logprobs import EntropyMode
from jaxrl_llm.algorithms.registry import resolve_declared

# float32 logits per chunk of `head_logprobs`: [rows, chunk, V] stays under 2**25 floats
# (128 MiB), and a chunk is at most LOGIT_CHUNK_MAX positions per row, so the chunks past
# the longest response in a micro-batch are skipped even when V is small.
LOGITS_PER_CHUNK = 1 << 25
LOGIT_CHUNK_MAX = 64


def pack_sequences(completions: Sequence[Any], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Prompt + response rows, right-padded to `seq_len` (static for the whole run).

    Returns input_ids [B,T], response_mask [B,T] (1 = model token), rollout_logprobs [B,T],
    response_length [B] (all response tokens, inserted ones included), truncated [B].
    """
    B = len(completions)
    ids = np.full((B, seq_len), pad_id, np.int32)
    mask = np.zeros((B, seq_len), np.float32)
    logp = np.zeros((B, seq_len), np.float32)
    lengths = np.zeros(B, np.int32)
    for b, c in enumerate(completions):
        p = np.asarray(c.prompt_ids, np.int32)
        r = np.asarray(c.token_ids, np.int32)
        if len(p) + len(r) > seq_len:
            raise ValueError(
                f"sequence of {len(p)} prompt + {len(r)} response tokens exceeds {seq_len}"
            )
        ids[b, : len(p)] = p
        ids[b, len(p) : len(p) + len(r)] = r
        mask[b, len(p) : len(p) + len(r)] = c.response_mask
        logp[b, len(p) : len(p) + len(r)] = c.logprobs
        lengths[b] = len(r)
    truncated = np.asarray([c.finish_reason == "length" for c in completions])
    return {
        "input_ids": ids,
        "response_mask": mask,
        "rollout_logprobs": logp,
        "response_length": lengths,
        "truncated": truncated,
    }


def shift_right(x: jax.Array) -> jax.Array:
    """[B, T-1] per-target values -> [B, T] action-aligned (index 0 gets 0)."""
    return jnp.pad(x, ((0, 0), (1, 0)))


def sequence_logprobs(model, input_ids: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Action-aligned log p(input_ids[t] | input_ids[<t]) [B, T] under softmax(logits / temp)."""
    logits = model(input_ids[:, :-1])
    return shift_right(token_logprobs(logits, input_ids[:, 1:], temperature=temperature))


def logit_chunk(rows: int, vocab: int) -> int:
    """Positions per row in one chunk of `head_logprobs` (see `LOGITS_PER_CHUNK`)."""
    return max(1, min(LOGIT_CHUNK_MAX, LOGITS_PER_CHUNK // (rows * vocab)))


def policy_logprobs(
    model, input_ids: jax.Array, mask: jax.Array, *, temperature: float,
    entropy: EntropyMode = "off",
) -> tuple[jax.Array, jax.Array | None]:  # fmt: skip
    """Action-aligned log p(input_ids[t] | input_ids[<t]) [B, T] under softmax(logits / temp),
    and the entropy there (None when "off"), where `mask[:, t] > 0`; 0 elsewhere. The trunk
    runs on every token, the LM head only on the masked ones (`head_logprobs`)."""
    hidden = model.hidden_states(input_ids[:, :-1])
    chunk = logit_chunk(input_ids.shape[0], model.config.vocab_size)
    lp, ent = head_logprobs(
        hidden, input_ids[:, 1:], mask[:, 1:], model.logits,
        temperature=temperature, chunk_size=chunk, entropy=entropy,
    )  # fmt: skip
    return shift_right(lp), None if ent is None else shift_right(ent)


def sequence_values(critic, input_ids: jax.Array) -> jax.Array:
    """Action-aligned values [B, T]: the critic's output one position before each token."""
    return shift_right(critic(input_ids[:, :-1]))


def make_logprob_fn(graphdef: nnx.GraphDef, temperature: float, micro_batch: int):
    """Jitted `(params, input_ids [B,T]) -> logprobs [B,T]`, in micro-batches (lax.map)."""

    @jax.jit
    def fn(params, input_ids):
        B, T = input_ids.shape
        mb = min(micro_batch, B)
        # Merge inside the loop body: a module merged outside cannot be used under nnx.remat.
        one = lambda x: sequence_logprobs(nnx.merge(graphdef, params), x, temperature)
        return jax.lax.map(one, input_ids.reshape(B // mb, mb, T)).reshape(B, T)

    return fn


def make_value_fn(graphdef: nnx.GraphDef, micro_batch: int):
    """Jitted `(params, input_ids [B,T]) -> values [B,T]`, in micro-batches (lax.map)."""

    @jax.jit
    def fn(params, input_ids):
        B, T = input_ids.shape
        mb = min(micro_batch, B)
        one = lambda x: sequence_values(nnx.merge(graphdef, params), x)
        return jax.lax.map(one, input_ids.reshape(B // mb, mb, T)).reshape(B, T)

    return fn


def make_advantage_fn(algo, group_size: int):
    """Jitted `(scores [B], loss_mask, old, ref logprobs, values) -> (adv, returns, rewards)`.

    The outcome score sits on the last trained token; with `kl_in_reward_coef > 0` the
    per-token KL to the reference is subtracted (verl `apply_kl_penalty`).
    """
    estimator = resolve_declared(
        "advantage", algo.estimator, group_size=group_size, norm_by_std=algo.norm_by_std,
        gamma=algo.gamma, lam=algo.lam,
    )  # fmt: skip

    @jax.jit
    def fn(scores, loss_mask, old_logprobs, ref_logprobs, values):
        token_rewards = outcome_token_rewards(scores, loss_mask)
        if algo.kl_in_reward_coef > 0:
            token_rewards = kl_shaped_rewards(
                token_rewards, old_logprobs, ref_logprobs, loss_mask,
                kl_coef=algo.kl_in_reward_coef, kind=algo.kl_in_reward_kind,
            )  # fmt: skip
        adv, returns = estimator(token_rewards, loss_mask, values=values)
        return adv, returns, token_rewards

    return fn


def all_equal_groups(scores: np.ndarray, group_size: int) -> np.ndarray:
    """[prompts] True where every sample of the group got the same score (no signal)."""
    g = scores.reshape(-1, group_size)
    return np.all(g == g[:, :1], axis=1)

"""From rollout completions to a `TrainBatch`: packing, the experience pass, its metrics.

Host-side packing is numpy. The experience pass is one jitted program: per micro-batch the
policy's old logprobs, the reference's logprobs and the critic's values (whichever the run
needs), then the advantages and the batch metrics over the whole batch, all on the mesh.
Logprobs come from the trunk's hidden states and the LM head on the masked positions only
(`algorithms.head_logprobs`); the policy step reads them the same way (`policy_logprobs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jaxtyping import Bool, Float, Int

from jaxrl_llm.algorithms import (
    head_logprobs,
    kl_penalty,
    kl_shaped_rewards,
    outcome_token_rewards,
)
from jaxrl_llm.algorithms.logprobs import EntropyMode
from jaxrl_llm.algorithms.masked import compute_dtype, masked_max, masked_mean, masked_min
from jaxrl_llm.algorithms.registry import resolve_declared
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.packing import Packing, pack, unpack
from jaxrl_llm.sharding.hosts import batch_sharding
from jaxrl_llm.types import Completion, TrainBatch

# float32 logits per chunk of `head_logprobs`: [rows, chunk, V] stays under 2**25 floats
# (128 MiB), and a chunk is at most LOGIT_CHUNK_MAX positions per row, so the chunks past
# the longest response in a micro-batch are skipped even when V is small.
LOGITS_PER_CHUNK = 1 << 25
LOGIT_CHUNK_MAX = 64


@dataclasses.dataclass(frozen=True)
class SequenceRows:
    """One sample per row on the host, prompt then response, right-padded to T = seq_len:
    the rows the experience pass and the `TrainBatch` are built from."""

    input_ids: Int[np.ndarray, "B T"]  # int32, pad_id past the sample's end
    response_mask: Float[np.ndarray, "B T"]  # 1 on model-written tokens
    tool_mask: Float[np.ndarray, "B T"]  # 1 on tokens a tool inserted
    rollout_logprobs: Float[np.ndarray, "B T"]  # the engine's; 0 on tool tokens (not sampled)
    response_length: Int[np.ndarray, " B"]  # all response tokens, inserted ones included
    length: Int[np.ndarray, " B"]  # prompt + response tokens
    truncated: Bool[np.ndarray, " B"]  # finished for its token budget ("length")


def pack_sequences(completions: Sequence[Completion], seq_len: int, pad_id: int) -> SequenceRows:
    """Prompt + response rows [B, T], right-padded to T = `seq_len` (static for the whole
    run), one sample per row: the `SequenceRows` of `completions` [B]."""
    B = len(completions)
    ids = np.full((B, seq_len), pad_id, np.int32)
    mask = np.zeros((B, seq_len), np.float32)
    tool = np.zeros((B, seq_len), np.float32)
    logp = np.zeros((B, seq_len), np.float32)
    lengths = np.zeros(B, np.int32)
    totals = np.zeros(B, np.int32)
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
        tool[b, len(p) : len(p) + len(r)] = 1 - np.asarray(c.response_mask)
        logp[b, len(p) : len(p) + len(r)] = c.logprobs
        lengths[b] = len(r)
        totals[b] = len(p) + len(r)
    truncated = np.asarray([c.finish_reason == "length" for c in completions])
    return SequenceRows(
        input_ids=ids,
        response_mask=mask,
        tool_mask=tool,
        rollout_logprobs=logp,
        response_length=lengths,
        length=totals,
        truncated=truncated,
    )


def turn_token_rewards(completions: Sequence[Completion], seq_len: int) -> np.ndarray:
    """[B, T] rows (as `pack_sequences` lays them out) with each sample's `turn_rewards` on
    the last token of its model turns (the runs of `response_mask` 1), in order. A turn
    scored twice (its observation cut by the budget, then its final step) gets both on its
    end, as do rewards past the last turn; a sample without turn rewards gets none here."""
    out = np.zeros((len(completions), seq_len), np.float32)
    for b, c in enumerate(completions):
        if not c.turn_rewards:
            continue
        mask = np.asarray(c.response_mask, np.int8)
        ends = np.flatnonzero(mask - np.append(mask[1:], 0) == 1)  # a run's last token
        if not len(ends):
            raise ValueError(f"sample {b} has turn rewards but no model token")
        at = np.minimum(np.arange(len(c.turn_rewards)), len(ends) - 1)
        np.add.at(out[b], len(c.prompt_ids) + ends[at], np.asarray(c.turn_rewards, np.float32))
    return out


def micro_batch_rows(micro_batch_size: int, batch: int, mini_batches: int = 1) -> int:
    """Rows per micro-batch when `batch` rows are cut into `mini_batches` mini-batches, each
    into micro-batches: `micro_batch_size`, or the whole mini-batch when that is smaller.
    The experience pass (the whole batch) and the update (a mini-batch at a time) both cut
    with it, so they run the same micro-batches; `RLConfig.validate` refuses a split it
    cannot make, by the fields' names."""
    if batch % mini_batches:
        raise ConfigError(
            f"AlgoConfig.mini_batches = {mini_batches} does not divide the batch of {batch} "
            "samples (DataConfig.prompts_per_step x RolloutConfig.n)"
        )
    mini = batch // mini_batches
    rows = min(micro_batch_size, mini)
    if mini % rows:
        raise ConfigError(
            f"AlgoConfig.micro_batch_size = {micro_batch_size} does not divide the mini-batch "
            f"of {mini} samples (batch {batch} / AlgoConfig.mini_batches = {mini_batches}): "
            f"use a divisor of {mini}, or {mini} or more for one micro-batch per mini-batch"
        )
    return rows


def shift_right(x: jax.Array) -> jax.Array:
    """[B, T-1] per-target values -> [B, T] action-aligned (index 0 gets 0)."""
    return jnp.pad(x, ((0, 0), (1, 0)))


def logit_chunk(rows: int, vocab: int) -> int:
    """Positions per row in one chunk of `head_logprobs` (see `LOGITS_PER_CHUNK`)."""
    return max(1, min(LOGIT_CHUNK_MAX, LOGITS_PER_CHUNK // (rows * vocab)))


def policy_logprobs(
    model, input_ids: jax.Array, mask: jax.Array, *, temperature: float,
    entropy: EntropyMode = "off", packing: Packing | None = None,
) -> tuple[jax.Array, jax.Array | None]:  # fmt: skip
    """Action-aligned log p(input_ids[t] | input_ids[<t]) [B, T] under softmax(logits / temp),
    and the entropy there (None when "off"), where `mask[:, t] > 0`; 0 elsewhere. The trunk
    runs on every token, the LM head only on the masked ones (`head_logprobs`). With
    `packing` the forward runs on the packed rows (`learner.packing`); same result."""
    if packing is None:
        return _row_logprobs(model, input_ids, mask, temperature, entropy, None)
    ids, m = pack(input_ids, packing), pack(mask, packing) * (packing.segment_ids > 0)
    lp, ent = _row_logprobs(model, ids, m, temperature, entropy, packing)
    return unpack(lp, packing), None if ent is None else unpack(ent, packing)


def _row_logprobs(model, ids, mask, temperature, entropy, packing: Packing | None):
    hidden = model.hidden_states(ids[:, :-1], *_packed_inputs(packing))
    chunk = logit_chunk(ids.shape[0], model.config.vocab_size)
    lp, ent = head_logprobs(
        hidden, ids[:, 1:], mask[:, 1:], model.logits,
        temperature=temperature, chunk_size=chunk, entropy=entropy,
    )  # fmt: skip
    return shift_right(lp), None if ent is None else shift_right(ent)


def _packed_inputs(packing: Packing | None) -> tuple:
    """(positions, attention_mask, segment_ids) of packed rows' inputs (all but the last
    token), or () for plain rows."""
    if packing is None:
        return ()
    return packing.positions[:, :-1], None, packing.segment_ids[:, :-1]


def sequence_values(critic, input_ids: jax.Array, packing: Packing | None = None) -> jax.Array:
    """Action-aligned values [B, T]: the critic's output one position before each token
    (0 at t = 0 and, with `packing`, past each sample's end)."""
    if packing is None:
        return shift_right(critic(input_ids[:, :-1]))
    ids = pack(input_ids, packing)
    values = unpack(shift_right(critic(ids[:, :-1], *_packed_inputs(packing))), packing)
    return values.at[:, 0].set(0.0)


def advantage_fn(algo, group_size: int):
    """`(rewards, trained_mask, old, ref logprobs, values) -> (adv, returns, token rewards)`.

    `trained_mask` [B, T]: the tokens a sample trains, before the overlong filter (a
    truncated sample's score still counts in its group's baseline; the filter applies to the
    loss only, `make_experience_fn`). `rewards` [B]: outcome scores, each on its row's last
    trained token; [B, T]: rewards already on their tokens (`turn_token_rewards`), kept
    where trained. With `kl_in_reward_coef > 0` the per-token KL to the reference is
    subtracted (verl `apply_kl_penalty`), weighted by `kl_coef` (a scalar, the adaptive
    controller's current value: `AlgoConfig.kl_in_reward_target`) or, when None, by
    `kl_in_reward_coef`.
    """
    estimator = resolve_declared(
        "advantage", algo.estimator, group_size=group_size, norm_by_std=algo.norm_by_std,
        gamma=algo.gamma, lam=algo.lam,
    )  # fmt: skip

    def fn(rewards, trained_mask, old_logprobs, ref_logprobs, values, kl_coef=None):
        if rewards.ndim == 1:
            token_rewards = outcome_token_rewards(rewards, trained_mask)
        else:
            token_rewards = rewards * trained_mask
        if algo.kl_in_reward_coef > 0:
            token_rewards = kl_shaped_rewards(
                token_rewards, old_logprobs, ref_logprobs, trained_mask,
                kl_coef=algo.kl_in_reward_coef if kl_coef is None else kl_coef,
                kind=algo.kl_in_reward_kind,
            )  # fmt: skip
        adv, returns = estimator(token_rewards, trained_mask, values=values)
        return adv, returns, token_rewards

    return fn


def make_experience_fn(
    graphdef: nnx.GraphDef, critic_graphdef: nnx.GraphDef | None, algo, *,
    temperature: float, group_size: int, micro_batch: int, old_logprobs: bool = True,
    mesh: Mesh | None = None,
):  # fmt: skip
    """The jitted experience pass:

        fn(params, ref_params | None, critic_params | None, input_ids, response_mask,
           trained_mask, rewards, rollout_logprobs, packing | None, sample_mask=None,
           kl_coef=None)
            -> (TrainBatch, sequence rewards [B], metrics)

    All arrays [B, T] unless noted, in and out on the mesh; `rewards` are the scores [B] or
    rewards on tokens [B, T] (`advantage_fn`). Per micro-batch of mb =
    `micro_batch_rows(micro_batch, B, algo.mini_batches)` rows (the update's; `lax.map`) one
    body runs the policy (old logprobs; skipped with `old_logprobs=False`, the on-policy
    shortcut, leaving zeros), the reference and the critic, each only where the run has it;
    logprobs are computed on the positions of `response_mask` (model tokens) or
    `trained_mask` (trained tokens: tool output too with `mask_tool_output=False`). Missing
    parts of the batch are zeros. A trained tool token was not sampled, so it has no rollout
    logprob: the batch's `rollout_logprobs` there are the old ones (a TIS weight of 1), and
    the rollout mismatch `rollout/logprob_diff/*` reads the model tokens of the samples
    trained on (`response_mask * sample_mask`), the tokens the on-policy step reads it over
    (its `loss_mask`, `steps.make_policy_step`). `packing` ([B / mb, ...],
    `learner.packing`): the forwards run on packed rows.

    `sample_mask` [B] (None: all 1): 0 on the samples the loss leaves out (the overlong
    filter, DAPO). Rewards, values, advantages and returns are computed over `trained_mask`
    as if nothing were filtered, so a filtered sample's score still counts in its group's
    baseline; only the batch's `loss_mask` (`trained_mask * sample_mask`), which the
    policy and critic losses read, and the metrics of the trained tokens leave it out.

    `kl_coef` (a float32 scalar; None: `AlgoConfig.kl_in_reward_coef`): the weight of the
    KL in the reward, which the adaptive controller changes step by step
    (`rl_loop.adapt_kl_coef`); an argument, so a new value is not a new program.

    `mesh`: the batch's fields come out with their rows over ("data", "fsdp"), as its
    inputs go in (`hosts.batch_sharding`), rather than where XLA would leave them (the
    advantages replicated on every device): the batch stays on the mesh through the update.
    """
    if not old_logprobs and algo.kl_in_reward_coef > 0:
        raise ValueError("a KL penalty in the reward needs the old logprobs (old_logprobs=True)")
    if not old_logprobs and not algo.mask_tool_output:
        raise ValueError(
            "training on tool output (mask_tool_output=False) needs the old logprobs "
            "(old_logprobs=True): they stand in for the tool tokens' missing rollout logprobs"
        )
    advantages = advantage_fn(algo, group_size)

    def forwards(params, ref_params, critic_params, ids, mask, packing):
        logprobs = lambda p: policy_logprobs(
            nnx.merge(graphdef, p), ids, mask, temperature=temperature, packing=packing
        )[0]
        old = logprobs(params) if old_logprobs else None
        ref = logprobs(ref_params) if ref_params is not None else None
        values = None
        if critic_params is not None:
            assert critic_graphdef is not None  # a critic's params come with its graph
            values = sequence_values(nnx.merge(critic_graphdef, critic_params), ids, packing)
        return old, ref, values

    @jax.jit
    def fn(params, ref_params, critic_params, input_ids, response_mask, trained_mask, rewards,
           rollout_logprobs, packing=None, sample_mask=None, kl_coef=None):  # fmt: skip
        B, T = input_ids.shape
        kl_coef = algo.kl_in_reward_coef if kl_coef is None else kl_coef
        mb = micro_batch_rows(micro_batch, B, algo.mini_batches)  # the update's micro-batches
        split = lambda x: x.reshape(B // mb, mb, T)
        one = lambda x: forwards(params, ref_params, critic_params, *x)
        logprob_mask = jnp.maximum(response_mask, trained_mask)
        outs = jax.lax.map(one, (split(input_ids), split(logprob_mask), packing))
        zeros = jnp.zeros((B, T), compute_dtype(trained_mask))  # float64 in a reference run
        old, ref, values = (zeros if x is None else x.reshape(B, T) for x in outs)
        adv, returns, token_rewards = advantages(
            rewards, trained_mask, old, ref, None if outs[2] is None else values, kl_coef
        )
        loss_mask, model_tokens = trained_mask, response_mask
        if sample_mask is not None:
            loss_mask = trained_mask * sample_mask[:, None].astype(trained_mask.dtype)
            model_tokens = response_mask * sample_mask[:, None].astype(response_mask.dtype)
        behaviour = jnp.where((trained_mask > 0) & (response_mask == 0), old, rollout_logprobs)
        batch = TrainBatch(
            input_ids=input_ids, loss_mask=loss_mask, old_logprobs=old, ref_logprobs=ref,
            advantages=adv, returns=returns, old_values=values, rollout_logprobs=behaviour,
        )  # fmt: skip
        if mesh is not None:
            batch = jax.tree.map(lambda x, m=mesh: _rows_on(m, x), batch)
        metrics = experience_metrics(batch, token_rewards, has_values=outs[2] is not None)
        if old_logprobs:
            metrics.update(logprob_diff_metrics(old, rollout_logprobs, model_tokens))
        if algo.kl_in_reward_coef > 0:
            metrics.update(
                reward_kl_metrics(old, ref, trained_mask, algo.kl_in_reward_kind, kl_coef)
            )
        return batch, token_rewards.sum(-1), metrics

    return fn


def _rows_on(mesh: Mesh, x: jax.Array) -> jax.Array:
    """`x` constrained to its rows over ("data", "fsdp") (`hosts.batch_sharding`)."""
    return jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.shape))


# The experience pass's metrics over samples; the others are over the trained tokens (a
# step with none, every sample overlong-filtered, does not report them: `learn.DeviceMetrics`).
PER_SAMPLE = ("critic/rewards/mean", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff")


def experience_metrics(
    batch: TrainBatch, token_rewards: jax.Array, *, has_values: bool
) -> dict[str, jax.Array]:
    """Rewards (over the samples: `PER_SAMPLE`), advantages (and values, returns) over the
    trained tokens, on the device."""
    mask = batch.loss_mask
    m = {
        "critic/rewards/mean": jnp.mean(token_rewards.sum(-1)),
        "critic/advantages/mean": masked_mean(batch.advantages, mask),
        "critic/advantages/max": masked_max(batch.advantages, mask),
        "critic/advantages/min": masked_min(batch.advantages, mask),
    }
    if has_values:
        m["critic/values/mean"] = masked_mean(batch.old_values, mask)
        m["critic/returns/mean"] = masked_mean(batch.returns, mask)
    return m


def reward_kl_metrics(
    old_logprobs: jax.Array, ref_logprobs: jax.Array, trained_mask: jax.Array, kind: str,
    kl_coef: float | jax.Array,
) -> dict[str, jax.Array]:  # fmt: skip
    """The KL the reward was penalised by (`AlgoConfig.kl_in_reward_coef > 0`), as verl's
    `apply_kl_penalty` reports it: `actor/reward_kl_penalty`, each sample's mean over its
    trained tokens of `kl_penalty(old, ref, kind)`, then the mean over the samples (the
    overlong-filtered ones too: their rewards carry the penalty), before the coefficient;
    `actor/reward_kl_penalty_coeff`, the coefficient `kl_coef`."""
    kl = kl_penalty(old_logprobs, ref_logprobs, kind)
    return {
        "actor/reward_kl_penalty": jnp.mean(masked_mean(kl, trained_mask, axis=-1)),
        "actor/reward_kl_penalty_coeff": jnp.asarray(kl_coef, kl.dtype),
    }


def logprob_diff_metrics(
    trainer_logprobs: jax.Array, rollout_logprobs: jax.Array, mask: jax.Array
) -> dict[str, jax.Array]:
    """|trainer - rollout| logprobs over `mask`: the engine / trainer mismatch."""
    diff = jnp.abs(trainer_logprobs - rollout_logprobs)
    return {
        "rollout/logprob_diff/mean": masked_mean(diff, mask),
        "rollout/logprob_diff/max": masked_max(diff, mask),
    }


def all_equal_groups(scores: np.ndarray, group_size: int) -> np.ndarray:
    """[prompts] True where every sample of the group got the same score (no signal)."""
    g = scores.reshape(-1, group_size)
    return np.all(g == g[:, :1], axis=1)

"""Jitted update steps: policy (clipped PG + KL loss + entropy) and critic (clipped value).

Each step takes a `TrainState` and a mini-batch stacked into micro-batches `[M, mb, T]`,
accumulates gradients over the micro-batches with a global normaliser (so the result equals
one full-mini-batch gradient), applies one optimiser update, and donates the old state.
The loss functions take arrays and the few hyperparameters they need; the options are
resolved from the registry once, when the step is built. The policy's logprobs and entropy
come from the LM head on the trained positions only (`experience.policy_logprobs`); the
entropy has a gradient only when its coefficient is non-zero (else it is a metric).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from jaxrl_llm.algorithms import aggregate_loss, kl_penalty, loss_normalizer, value_loss
from jaxrl_llm.algorithms.masked import masked_max, masked_min, safe_divide
from jaxrl_llm.algorithms.off_policy import importance_weights, rejection_mask
from jaxrl_llm.algorithms.registry import resolve_declared
from jaxrl_llm.learner.experience import (
    logprob_diff_metrics,
    micro_batch_rows,
    policy_logprobs,
    sequence_values,
)
from jaxrl_llm.learner.packing import Packing
from jaxrl_llm.learner.state import (
    TrainState,
    UpdateStep,
    accumulate_gradients,
    apply_gradients,
)
from jaxrl_llm.sharding.hosts import batch_sharding
from jaxrl_llm.types import Leaf, TrainBatch


def exactly_on_policy(algo) -> bool:
    """One epoch of one mini-batch and no KL in the reward: the policy step's own logprobs
    (under stop_gradient) are the old logprobs, so the ratio is 1 and the experience pass
    can skip the old-logprob forward. A KL in the reward needs them before the update, and
    so does trained tool output (`mask_tool_output=False`: they fill its rollout logprobs),
    and the off-policy correction's mask mode (its rejection, from the old logprobs, must be
    known before the mini-batch's normaliser: `_rejecting`)."""
    once = algo.ppo_epochs == 1 and algo.mini_batches == 1
    return once and algo.kl_in_reward_coef == 0 and algo.mask_tool_output and not rejects(algo)


def rejects(algo) -> bool:
    """Whether the off-policy correction rejects tokens (`is_mode = "mask"`)."""
    return algo.is_cap is not None and algo.is_mode == "mask"


def _scale(algo, response_budget: int | None) -> int | None:
    """`seq-mean-token-sum-norm`'s constant divisor: the response budget (Dr.GRPO's
    MAX_TOKENS), which the rows' length (prompt budget + response budget) is not."""
    if algo.loss_agg == "seq-mean-token-sum-norm" and response_budget is None:
        raise ValueError(
            "AlgoConfig.loss_agg = 'seq-mean-token-sum-norm' divides by the response budget: "
            "build the step with response_budget=RolloutConfig.max_new_tokens"
        )
    return response_budget


def _rejecting(algo):
    """The mask mode's rejection, applied to the whole mini-batch before its normaliser:
    `batch [M, mb, T] -> (batch less the rejected tokens, is/* metrics over its trained
    tokens before the rejection, and `is/checked_tokens`: their count)`, as verl's rejection
    sampling edits `response_mask`."""

    def prepare(batch: TrainBatch) -> tuple[TrainBatch, dict[str, jax.Array]]:
        inputs = (batch.old_logprobs, batch.rollout_logprobs, batch.loss_mask)
        bounds = dict(level=algo.is_level, cap=algo.is_cap, floor=algo.is_floor)
        _, metrics = importance_weights(*inputs, mode="mask", **bounds)
        kept = rejection_mask(*inputs, **bounds)
        metrics["is/checked_tokens"] = batch.loss_mask.sum()
        return dataclasses.replace(batch, loss_mask=kept), metrics

    return prepare


def _policy_loss_fn(algo):
    return resolve_declared(
        "policy_loss", algo.policy_loss, clip_low=algo.clip_low, clip_high=algo.clip_high,
        dual_clip_c=algo.dual_clip_c,
    )  # fmt: skip


def make_policy_step(
    graphdef: nnx.GraphDef, tx: optax.GradientTransformation, algo, temperature,
    *, on_policy: bool = False, response_budget: int | None = None,
):  # fmt: skip
    """`step(state, batch: TrainBatch [M, mb, T], packing=None, frozen=None) -> (state,
    metrics)`. `frozen`: with LoRA, the frozen base params the state's adapters sit on
    (`learner.lora`): the policy is `nnx.merge(graphdef, state.params, frozen)`, and only
    `state.params` gets gradients.

    `on_policy` (see `exactly_on_policy`): the old logprobs are the step's own under
    stop_gradient (`batch.old_logprobs` is not read), and the metrics add the rollout
    mismatch `rollout/logprob_diff/*` over the trained tokens from those logprobs.

    `response_budget` (`RolloutConfig.max_new_tokens`): the divisor of
    `seq-mean-token-sum-norm` (required in that mode). With `is_mode = "mask"` the rejected
    tokens leave `loss_mask` before anything else (`_rejecting`)."""
    pg_fn = _policy_loss_fn(algo)
    agg, scale = algo.loss_agg, _scale(algo, response_budget)
    if on_policy and rejects(algo):
        raise ValueError(
            "AlgoConfig.is_mode = 'mask' rejects tokens from the old logprobs before the "
            "step: build it with on_policy=False (steps.exactly_on_policy says so)"
        )

    def loss_fn(params, mb: TrainBatch, packing: Packing | None, normalizer, frozen):
        model = nnx.merge(graphdef, params, *(() if frozen is None else (frozen,)))
        mask = mb.loss_mask
        logp, ent = policy_logprobs(
            model, mb.input_ids, mask, temperature=temperature,
            entropy="loss" if algo.entropy_coef else "metric", packing=packing,
        )  # fmt: skip
        assert ent is not None  # asked for
        old = jax.lax.stop_gradient(logp) if on_policy else mb.old_logprobs
        advantages = mb.advantages
        is_metrics = {}
        if algo.is_cap is not None:
            # Off-policy correction (decoupled PPO): the advantage weighted by
            # pi_old / pi_sampler, truncated or masked (algorithms/off_policy.py). In mask
            # mode `mask` is already without the rejected tokens, and the metrics come from
            # the whole mini-batch (`_rejecting`).
            w, is_metrics = importance_weights(
                old, mb.rollout_logprobs, mask, level=algo.is_level, mode=algo.is_mode,
                cap=algo.is_cap, floor=algo.is_floor,
            )  # fmt: skip
            advantages = advantages * jax.lax.stop_gradient(w)
            is_metrics = {} if rejects(algo) else is_metrics
        agg_kw = dict(normalizer=normalizer, scale_factor=scale)
        pg_loss, m = pg_fn(logp, old, advantages, mask, agg=agg, **agg_kw)
        total = pg_loss
        metrics = {"actor/pg_loss": pg_loss, **{f"actor/{k}": v for k, v in m.items()}}
        metrics.update(is_metrics)
        if algo.use_kl_loss:
            kl = kl_penalty(logp, mb.ref_logprobs, algo.kl_loss_kind)
            kl_loss = aggregate_loss(kl, mask, agg, **agg_kw)
            total = total + algo.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss
        ent_loss = aggregate_loss(ent, mask, agg, **agg_kw)
        metrics["actor/entropy"] = ent_loss
        if algo.entropy_coef:
            total = total - algo.entropy_coef * ent_loss
        return total, (metrics, jax.lax.stop_gradient(logp) if on_policy else None)

    summed = ("actor/pg_loss", "actor/kl_loss", "actor/entropy")
    token_means = (  # over the trained tokens
        "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "is/weight/mean",
        "is/clipped_frac",
    )  # fmt: skip
    prepare = _rejecting(algo) if rejects(algo) else None
    return _make_update(loss_fn, tx, agg, "actor", summed, token_means, prepare)


def make_critic_step(
    graphdef: nnx.GraphDef, tx: optax.GradientTransformation, algo,
    *, response_budget: int | None = None,
):  # fmt: skip
    """`step(state, batch [M, mb, T], packing=None) -> (state, metrics)`: the clipped value
    loss. `response_budget`: as `make_policy_step`'s."""
    agg, scale = algo.loss_agg, _scale(algo, response_budget)

    def loss_fn(params, mb: TrainBatch, packing: Packing | None, normalizer, frozen):
        del frozen  # the critic is trained whole
        critic = nnx.merge(graphdef, params)
        values = sequence_values(critic, mb.input_ids, packing)
        loss, m = value_loss(
            values, mb.old_values, mb.returns, mb.loss_mask,
            clip=algo.value_clip, agg=agg, normalizer=normalizer, scale_factor=scale,
        )  # fmt: skip
        return loss, ({"critic/vf_loss": loss, "critic/vf_clipfrac": m["vf_clipfrac"]}, None)

    return _make_update(loss_fn, tx, agg, "critic", ("critic/vf_loss",), ("critic/vf_clipfrac",))


def _make_update(
    loss_fn, tx, agg: str, role: str, summed: tuple[str, ...], token_means: tuple[str, ...] = (),
    prepare=None,
):  # fmt: skip
    """The jitted step both roles share: a global normaliser over the whole mini-batch,
    gradients accumulated over its micro-batches, one optimiser update (skipped if not
    finite). `loss_fn -> (loss, (metrics, logprobs | None))`; its metrics are reduced over
    the micro-batches by `reduce_micro_batches`. Logprobs, when given (on-policy), are
    compared with the rollout's over the trained tokens. `packing` ([M, ...],
    `learner.packing`): the forwards run on packed rows. `frozen`: params the loss reads but
    does not train (LoRA's base; not donated). `prepare(batch) -> (batch, metrics)`: run
    on the whole mini-batch first (the mask mode's rejection), its metrics reported as they
    are. `{role}/trained_tokens`: the mini-batch's trained tokens, which the update's other
    metrics are over (an update with none, every sample overlong-filtered, trained nothing:
    `learn.DeviceMetrics` leaves its values out of the step's)."""

    def step(
        state: TrainState, batch: TrainBatch, packing: Packing | None = None, frozen: Any = None
    ):
        batch, prepared = (batch, {}) if prepare is None else prepare(batch)
        flat_mask = batch.loss_mask.reshape(-1, batch.loss_mask.shape[-1])
        normalizer = loss_normalizer(flat_mask, agg)
        loss, grads, (metrics, logprobs) = accumulate_gradients(
            lambda p, xs: loss_fn(p, *xs, normalizer, frozen), state.params, (batch, packing)
        )
        tokens = batch.loss_mask.sum((1, 2))  # [M]
        metrics = {**reduce_micro_batches(metrics, tokens, summed, token_means), **prepared}
        metrics[f"{role}/trained_tokens"] = tokens.sum()
        if logprobs is not None:
            mask = batch.loss_mask
            metrics.update(logprob_diff_metrics(logprobs, batch.rollout_logprobs, mask))
        state, opt = apply_gradients(state, grads, tx, loss)
        return state, {
            **metrics,
            f"{role}/loss": loss,
            f"{role}/grad_norm": opt["grad_norm"],
            f"{role}/skipped": opt["skipped"],
        }

    return UpdateStep(step)


def extreme(name: str) -> str | None:
    """How a metric named `.../max` or `.../min` is reduced over micro-batches and updates
    ("max", "min": it is an extreme over the tokens or samples it describes); else None."""
    last = name.rsplit("/", 1)[-1]
    return last if last in ("max", "min") else None


def reduce_micro_batches(
    metrics: dict[str, jax.Array], tokens: jax.Array, summed: tuple[str, ...],
    token_means: tuple[str, ...],
) -> dict[str, jax.Array]:  # fmt: skip
    """Each metric [M] (one value per micro-batch, `tokens` [M] trained tokens in each) to
    the mini-batch's value. `summed`: loss terms already normalised globally, so their sum
    is exact. `.../max`, `.../min` (`extreme`): the extreme over the micro-batches with a
    trained token. `token_means` (the clip fractions, `ppo_kl`, `is/*`): means over the
    trained tokens, weighted by each micro-batch's count, so an empty micro-batch (every
    sample overlong-filtered) does not pull them toward 0 and the value does not depend on
    micro_batch_size (verl takes the plain mean over micro-batches). The others: the mean
    over micro-batches."""
    has = tokens > 0
    out = {}
    for k, v in metrics.items():
        if k in summed:
            out[k] = v.sum(0)
        elif extreme(k) == "max":
            out[k] = masked_max(v, has)
        elif extreme(k) == "min":
            out[k] = masked_min(v, has)
        elif k in token_means:
            out[k] = safe_divide((v * tokens.astype(v.dtype)).sum(0), tokens.sum().astype(v.dtype))
        else:
            out[k] = v.mean(0)
    return out


def to_micro_batches(batch: TrainBatch[Leaf], idx: Any, micro_batch_size: int) -> TrainBatch[Leaf]:
    """Rows `idx` of `batch` (a mini-batch), reshaped [M, mb, T] (`micro_batch_rows`)."""

    def take(x):
        x = x[idx]
        mb = micro_batch_rows(micro_batch_size, x.shape[0])
        return x.reshape(x.shape[0] // mb, mb, *x.shape[1:])

    return jax.tree.map(take, batch)


def make_micro_batch_fn(mesh: Mesh, micro_batch_size: int):
    """Jitted `(batch [B, T] on the mesh, rows [mini]) -> those rows as [M, mb, T]`, the mb
    rows over ("data", "fsdp"): a mini-batch cut on the device, from a batch put there once."""

    @jax.jit
    def fn(batch: TrainBatch, rows: jax.Array) -> TrainBatch:
        out = to_micro_batches(batch, rows, micro_batch_size)
        place = lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.shape, 1))
        return jax.tree.map(place, out)

    return fn

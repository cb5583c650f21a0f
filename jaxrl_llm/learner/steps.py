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

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_llm.algorithms import aggregate_loss, kl_penalty, loss_normalizer, value_loss
from jaxrl_llm.algorithms.registry import resolve_declared
from jaxrl_llm.learner.experience import policy_logprobs, sequence_values
from jaxrl_llm.learner.state import TrainState, accumulate_gradients, apply_gradients
from jaxrl_llm.types import Leaf, TrainBatch


def _policy_loss_fn(algo):
    return resolve_declared(
        "policy_loss", algo.policy_loss, clip_low=algo.clip_low, clip_high=algo.clip_high,
        dual_clip_c=algo.dual_clip_c,
    )  # fmt: skip


def make_policy_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, algo, temperature):
    """`step(state, batch: TrainBatch [M, mb, T]) -> (state, metrics)`."""
    pg_fn = _policy_loss_fn(algo)
    agg = algo.loss_agg

    def loss_fn(params, mb: TrainBatch, normalizer):
        model = nnx.merge(graphdef, params)
        mask = mb.loss_mask
        logp, ent = policy_logprobs(
            model, mb.input_ids, mask, temperature=temperature,
            entropy="loss" if algo.entropy_coef else "metric",
        )  # fmt: skip
        assert ent is not None  # asked for
        advantages = mb.advantages
        if algo.tis_cap is not None:
            # Truncated importance sampling (Yao et al. 2025): weight by
            # min(pi_old_trainer / pi_rollout, C); positive, so it scales the advantage.
            w = jnp.minimum(jnp.exp(mb.old_logprobs - mb.rollout_logprobs), algo.tis_cap)
            advantages = advantages * jax.lax.stop_gradient(w)
        pg_loss, m = pg_fn(logp, mb.old_logprobs, advantages, mask, agg=agg, normalizer=normalizer)
        total = pg_loss
        metrics = {"actor/pg_loss": pg_loss, **{f"actor/{k}": v for k, v in m.items()}}
        if algo.use_kl_loss:
            kl = kl_penalty(logp, mb.ref_logprobs, algo.kl_loss_kind)
            kl_loss = aggregate_loss(kl, mask, agg, normalizer=normalizer)
            total = total + algo.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss
        ent_loss = aggregate_loss(ent, mask, agg, normalizer=normalizer)
        metrics["actor/entropy"] = ent_loss
        if algo.entropy_coef:
            total = total - algo.entropy_coef * ent_loss
        return total, metrics

    summed = ("actor/pg_loss", "actor/kl_loss", "actor/entropy")
    return _make_update(loss_fn, tx, agg, "actor", summed)


def make_critic_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, algo):
    agg = algo.loss_agg

    def loss_fn(params, mb: TrainBatch, normalizer):
        critic = nnx.merge(graphdef, params)
        values = sequence_values(critic, mb.input_ids)
        loss, m = value_loss(
            values, mb.old_values, mb.returns, mb.loss_mask,
            clip=algo.value_clip, agg=agg, normalizer=normalizer,
        )  # fmt: skip
        return loss, {"critic/vf_loss": loss, "critic/vf_clipfrac": m["vf_clipfrac"]}

    return _make_update(loss_fn, tx, agg, "critic", ("critic/vf_loss",))


def _make_update(loss_fn, tx, agg: str, role: str, summed: tuple[str, ...]):
    """The jitted step both roles share: a global normaliser over the whole mini-batch,
    gradients accumulated over its micro-batches, one optimiser update (skipped if not
    finite). Metrics in `summed` are loss terms already normalised globally, so their
    micro-batch sums are exact; the others (ratios such as clip fractions) are averaged over
    micro-batches, as verl does."""

    @jax.jit(donate_argnums=0)
    def step(state: TrainState, batch: TrainBatch):
        flat_mask = batch.loss_mask.reshape(-1, batch.loss_mask.shape[-1])
        normalizer = loss_normalizer(flat_mask, agg)
        M = batch.loss_mask.shape[0]
        loss, grads, metrics = accumulate_gradients(
            lambda p, mb: loss_fn(p, mb, normalizer), state.params, batch
        )
        metrics = {k: v if k in summed else v / M for k, v in metrics.items()}
        state, opt = apply_gradients(state, grads, tx, loss)
        return state, {
            **metrics,
            f"{role}/loss": loss,
            f"{role}/grad_norm": opt["grad_norm"],
            f"{role}/skipped": opt["skipped"],
        }

    return step


def to_micro_batches(batch: TrainBatch[Leaf], idx: Any, micro_batch_size: int) -> TrainBatch[Leaf]:
    """Rows `idx` of `batch`, reshaped [M, mb, T]."""

    def take(x):
        x = x[idx]
        mb = min(micro_batch_size, x.shape[0])
        return x.reshape(x.shape[0] // mb, mb, *x.shape[1:])

    return jax.tree.map(take, batch)

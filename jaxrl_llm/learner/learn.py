"""From a rollout to updated states, the numeric half of an RL step (`rl_loop.train_step`
orchestrates it): the experience pass on the mesh (`make_experience`), then `ppo_epochs` x
`mini_batches` policy (and critic) updates (`update`), each packed when packing pays, and
the step's device metrics fetched in one transfer (`fetch`)."""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.typing import ArrayLike

from jaxrl_llm.learner.experience import (
    PER_SAMPLE,
    micro_batch_rows,
    pack_sequences,
    turn_token_rewards,
)
from jaxrl_llm.learner.packing import (
    Packing,
    forward_positions,
    packing_layout,
    padding_fraction,
    worth_packing,
)
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.run import Learner
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.learner.steps import extreme
from jaxrl_llm.metrics.progress import bar
from jaxrl_llm.sharding import hosts
from jaxrl_llm.types import Experience, Rollout

log = logging.getLogger(__name__)


@dataclasses.dataclass
class DeviceMetrics:
    """A step's metrics still on the device: each metric's values (one per update, or one)
    and, for a metric over tokens, the count of its tokens beside each value. A value over
    no token (an update whose samples were all overlong-filtered) is left out of its
    metric's reduction, and a metric with no value over a token is not reported that step
    (`fetch`): a mean over nothing is neither 0 nor a divergence's NaN."""

    values: dict[str, list[jax.Array]] = dataclasses.field(default_factory=dict)
    counts: dict[str, list[ArrayLike]] = dataclasses.field(default_factory=dict)

    def add(self, metrics: dict[str, jax.Array], count: ArrayLike | None = None) -> None:
        """One value of each metric; `count`: the tokens they are over (None: not over
        tokens)."""
        for k, v in metrics.items():
            self.values.setdefault(k, []).append(v)
            if count is not None:
                self.counts.setdefault(k, []).append(count)


def make_experience(
    cfg: RLConfig, learner: Learner, samples: Rollout, step: int
) -> tuple[Experience, DeviceMetrics, float, list[MiniBatch]]:
    """Rows on the host; they go to the mesh once (over ("data", "fsdp"),
    `hosts.put_batch`) for the experience pass, and the `TrainBatch` stays there. The
    step's update programs not compiled yet compile on a thread meanwhile
    (`compile_ahead`). Returns the experience, its device metrics, the padding share of its
    forwards and the step's mini-batch plan (`mini_batch_plan`, for `update`)."""
    pad = learner.tokenizer.pad_token_id
    seqs = pack_sequences(samples.completions, cfg.seq_len, 0 if pad is None else pad)
    state, mesh = learner.state, learner.mesh
    B = len(samples.completions)
    micro = micro_batch_rows(cfg.algo.micro_batch_size, B, cfg.algo.mini_batches)  # the update's
    packing = _packing(cfg, mesh, seqs.length, micro)
    trained_mask = seqs.response_mask
    if not cfg.algo.mask_tool_output:  # the ablation: tool output trained too
        trained_mask = trained_mask + seqs.tool_mask
    # The overlong filter (DAPO) leaves truncated samples out of the loss only: their scores
    # still place rewards and count in their group's baseline.
    keep = ~seqs.truncated if cfg.algo.overlong_filter else np.ones(B, bool)
    plan = mini_batch_plan(cfg, mesh, step, seqs.length)
    shapes = [_micro_batch_shape(cfg, part.rows.size) for part in plan]
    learner.compiler.start(learner, shapes, [p.packing for p in plan], trained_mask.dtype)
    rows = lambda x: hosts.put_batch(x, hosts.batch_sharding(mesh, x.shape))
    critic = state.critic.params if state.critic is not None else None
    # An environment's per-turn rewards go on their turns' tokens; else each score on the
    # sample's last trained token (inside the experience pass).
    per_turn = any(c.turn_rewards for c in samples.completions)
    rewards = turn_token_rewards(samples.completions, cfg.seq_len) if per_turn else samples.scores
    batch, sequence_rewards, tokens = learner.experience_fn(
        learner.policy_params(), learner.ref_params, critic,
        rows(seqs.input_ids), rows(seqs.response_mask), rows(trained_mask),
        rows(rewards), rows(seqs.rollout_logprobs), _put_packing(mesh, packing),
        sample_mask=rows(keep.astype(np.float32)),
        kl_coef=None if state.kl_coef is None else np.float32(state.kl_coef),
    )  # fmt: skip
    exp = Experience(
        rollout=samples,
        batch=batch,
        model_mask=seqs.response_mask,
        response_length=seqs.response_length,
        length=seqs.length,
        truncated=seqs.truncated,
        sequence_rewards=sequence_rewards,
        has_values=critic is not None,
    )
    device = DeviceMetrics()
    device.add({k: tokens.pop(k) for k in PER_SAMPLE if k in tokens})
    # Counted on the mesh: a host holds its own samples only (multi-host), the batch all.
    device.add(tokens, jnp.sum(batch.loss_mask))
    return exp, device, padding_fraction(seqs.length, packing, cfg.seq_len), plan


@dataclasses.dataclass(frozen=True)
class MiniBatch:
    """One update's rows of the batch (host int32 [mini]) and their packing (None: one
    padded sample per row)."""

    rows: np.ndarray
    packing: Packing[np.ndarray] | None


def mini_batch_plan(cfg: RLConfig, mesh: Mesh, step: int, lengths: np.ndarray) -> list[MiniBatch]:
    """The step's `ppo_epochs` x `mini_batches` updates in order: each epoch a permutation
    of the B samples drawn from (seed, step), cut into mini-batches, each packed when that
    pays (`_packing`; `lengths` [B]: each sample's tokens)."""
    a = cfg.algo
    B = len(lengths)
    mini = B // a.mini_batches
    micro = micro_batch_rows(a.micro_batch_size, mini)
    rng = np.random.default_rng([cfg.seed, step])
    plan = []
    for _ in range(a.ppo_epochs):
        order = rng.permutation(B).astype(np.int32)
        for k in range(a.mini_batches):
            rows = order[k * mini : (k + 1) * mini]
            plan.append(MiniBatch(rows, _packing(cfg, mesh, lengths[rows], micro)))
    return plan


def _micro_batch_shape(cfg: RLConfig, mini: int) -> tuple[int, int, int]:
    """[M, mb, T] of a mini-batch of `mini` samples (`steps.to_micro_batches`)."""
    mb = micro_batch_rows(cfg.algo.micro_batch_size, mini)
    return (mini // mb, mb, cfg.seq_len)


def _packing(
    cfg: RLConfig, mesh: Mesh, lengths: np.ndarray, micro_batch: int
) -> Packing[np.ndarray] | None:
    """The packed rows of micro-batches of `micro_batch` consecutive samples, or None when
    the run does not pack (`PolicyConfig.pack_sequences`) or packing would not pay."""
    if not cfg.policy.pack_sequences:
        return None
    # Rows split over the batch axes when the micro-batch's do (`hosts.batch_sharding`).
    split = mesh.shape["data"] * mesh.shape["fsdp"]
    split = split if micro_batch % split == 0 else 1
    packing = packing_layout(lengths, micro_batch, cfg.seq_len, multiple=split)
    return packing if worth_packing(packing, micro_batch) else None


def _put_packing(mesh: Mesh, packing: Packing[np.ndarray] | None) -> Packing | None:
    """On the mesh, its rows (axis 1) split like the micro-batches'."""
    put = lambda x: hosts.put_batch(x, hosts.batch_sharding(mesh, x.shape, 1))
    return None if packing is None else jax.tree.map(put, packing)


def host_metrics(exp: Experience) -> dict[str, float]:
    """What the host already holds: scores and response lengths (the rest is on the device,
    `experience.experience_metrics`)."""
    scores, lengths = exp.rollout.scores, exp.response_length
    m = {
        "critic/score/mean": scores.mean(),
        "critic/score/max": scores.max(),
        "critic/score/min": scores.min(),
        "response_length/mean": lengths.mean(),
        "response_length/max": lengths.max(),
        "response_length/min": lengths.min(),
        "response_length/clip_ratio": exp.truncated.mean(),
    }
    return {k: float(v) for k, v in m.items()}


def update(
    cfg: RLConfig, learner: Learner, step: int, exp: Experience, plan: list[MiniBatch]
) -> tuple[TrainState, TrainState | None, DeviceMetrics, float]:
    """The `plan`'s updates of the learner's policy (and critic), `make_experience`'s
    `mini_batch_plan`: each mini-batch is cut from the batch on the mesh as [M, mb, T]
    (`learner.micro_batches`) and packed as the plan says. Returns the updated policy and
    critic states (the steps donate the ones they are given: the caller puts these in
    their place), each metric's values, one per update, each counted by its update's
    trained tokens (`_add_update`), and the padding share of the updates' forwards."""
    a, mesh, batch = cfg.algo, learner.mesh, exp.batch
    policy, critic = learner.state.policy, learner.state.critic
    positions = 0
    out = DeviceMetrics()
    progress = bar(f"update {step}", len(plan), unit="mb")
    replicated = NamedSharding(mesh, PartitionSpec())
    learner.compiler.wait()  # the programs `make_experience` had compiled ahead
    for part in plan:
        mb = learner.micro_batches(batch, hosts.put_batch(part.rows, replicated))
        positions += forward_positions(part.rows.size, part.packing, cfg.seq_len)
        packing = _put_packing(mesh, part.packing)
        if learner.critic_step is not None:
            critic, cm = learner.critic_step(critic, mb, packing)
            _add_update(out, cm, "critic")
        policy, pm = learner.policy_step(policy, mb, packing, learner.frozen)
        _add_update(out, pm, "actor")
        progress.update()
    progress.close()
    out.add({"actor/lr_step": policy.step})
    return policy, critic, out, 1.0 - a.ppo_epochs * float(exp.length.sum()) / positions


def _add_update(out: DeviceMetrics, metrics: dict[str, jax.Array], role: str) -> None:
    """One update's metrics: `{role}/skipped` and `{role}/trained_tokens` describe the update
    itself; the others its trained tokens, which count them. The mask mode's `is/*` are
    over the tokens it checked before its rejection (`is/checked_tokens`, `steps._rejecting`)."""
    trained = metrics[f"{role}/trained_tokens"]
    per_update = {k: metrics.pop(k) for k in (f"{role}/skipped", f"{role}/trained_tokens")}
    checked = metrics.pop("is/checked_tokens", None)
    if checked is not None:
        out.add({k: metrics.pop(k) for k in list(metrics) if k.startswith("is/")}, checked)
    out.add(per_update)
    out.add(metrics, trained)


@functools.partial(jax.jit, static_argnums=2)
def _reduced(
    values: list[list[jax.Array]], counts: list[list[ArrayLike] | None],
    kinds: tuple[str | None, ...],
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """Each metric's reduction over its values counted by a token (all, without counts),
    and whether it has one."""
    out, defined = [], []
    for v, n, kind in zip(values, counts, kinds, strict=True):
        v = jnp.stack(v).astype(jnp.float32)
        has = jnp.ones(v.shape, bool) if n is None else jnp.stack(n) > 0
        if kind == "max":
            out.append(jnp.max(jnp.where(has, v, -jnp.inf)))
        elif kind == "min":
            out.append(jnp.min(jnp.where(has, v, jnp.inf)))
        else:
            out.append(jnp.sum(jnp.where(has, v, 0.0)) / jnp.maximum(has.sum(), 1))
        defined.append(jnp.any(has))
    return jnp.stack(out), jnp.stack(defined)


def fetch(*parts: DeviceMetrics) -> dict[str, float]:
    """Each metric over its values (one per update, or one) that are over a token
    (`DeviceMetrics`): the max of a `.../max`, the min of a `.../min` (`steps.extreme`),
    else the mean; a metric with none is left out. All reduced on the device first, so a
    step's metrics come to the host in one transfer."""
    values = {k: v for p in parts for k, v in p.values.items()}
    counts = {k: n for p in parts for k, n in p.counts.items()}
    keys = list(values)
    kinds = tuple(extreme(k) for k in keys)
    reduced, defined = hosts.to_host(
        _reduced([values[k] for k in keys], [counts.get(k) for k in keys], kinds)
    )
    return {k: float(v) for k, v, d in zip(keys, reduced, defined, strict=True) if d}


def warn_skipped(step: int, metrics: dict[str, float], updates: int) -> None:
    for role in ("actor", "critic"):
        skipped = round(metrics.get(f"{role}/skipped", 0.0) * updates)
        if skipped:
            log.warning(
                "step %d: non-finite %s loss or gradient in %d of %d mini-batch updates; "
                "those updates were skipped, parameters unchanged", step, role, skipped, updates,
            )  # fmt: skip

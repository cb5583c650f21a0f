"""The RL loop: orchestration only (the math lives in `algorithms/`, `experience.py`, `steps.py`).

One step: prompts -> rollout with the live params -> rewards -> old/ref logprobs and values
-> advantages -> ppo_epochs x mini-batches of critic and policy updates -> metrics ->
validation / checkpoint. Every random draw derives from `RLConfig.seed` and the step, so a
resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.config import write_resolved_config
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.pipeline import PromptIterator
from jaxrl_llm.learner import ahead as ahead_lib
from jaxrl_llm.learner.experience import (
    all_equal_groups,
    pack_sequences,
    turn_token_rewards,
)
from jaxrl_llm.learner.export import export_final
from jaxrl_llm.learner.overlap import RolloutProducer, staleness_metrics
from jaxrl_llm.learner.packing import (
    Packing,
    forward_positions,
    packing_layout,
    padding_fraction,
    worth_packing,
)
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.run import Learner, Run, build_run, device_state
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.metrics import MetricsWriter
from jaxrl_llm.metrics.health import HealthMonitor
from jaxrl_llm.metrics.plots import write_dashboard
from jaxrl_llm.metrics.progress import bar, summary_line
from jaxrl_llm.metrics.samples import record_step_samples
from jaxrl_llm.rewards.pool import Scorer
from jaxrl_llm.rollout.sampler import PolicyWeights, Refresh
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.sharding import hosts
from jaxrl_llm.types import Experience, Rollout

log = logging.getLogger(__name__)


def run_rl(cfg: RLConfig, *, resume: bool = False, stop_after: int | None = None) -> list[dict]:
    """Train; returns the metric records written this call. `stop_after` ends early (tests)."""
    return train(build_run(cfg, resume=resume), stop_after=stop_after)


def train(run: Run, *, stop_after: int | None = None) -> list[dict]:
    """Step until `cfg.steps`: rollout -> experience -> update, then log / validate / save;
    with `RLConfig.max_staleness` >= 1 the rollout of later steps overlaps (`overlap.py`)."""
    cfg, state, run_dir = run.cfg, run.learner.state, run.run_dir
    try:
        if jax.process_index() == 0:
            write_resolved_config(run_dir)
        writer = MetricsWriter(run_dir, resume_step=state.step if run.resumed else None)
        producer = _producer(run)
    except BaseException:
        close_run(run)
        raise
    health = HealthMonitor()
    records: list[dict] = []
    try:
        if state.step == 0 and cfg.eval_every:
            m = _validate(run)  # the producer starts after it
            writer.write(0, m)
            records.append({"step": 0, **m})
            _refresh_dashboard(run_dir)
        if producer is not None:
            producer.start(state.policy.params, run.learner.frozen)
        while state.step < cfg.steps:
            step = state.step + 1
            evaluate = bool(cfg.eval_every) and (step % cfg.eval_every == 0 or step == cfg.steps)
            metrics = train_step(run, step, producer, publish=not evaluate)
            state.step = step
            if evaluate:
                t0 = time.perf_counter()
                metrics.update(_validate(run, producer, step))
                metrics["timing/validate"] = time.perf_counter() - t0
                if producer is not None:  # held back until validation has the sampler
                    producer.publish(step, state.policy.params, run.learner.frozen)
            writer.write(step, metrics)
            records.append({"step": step, **metrics})
            log.info(summary_line(step, metrics))
            if jax.process_index() == 0:
                health.check(step, metrics)
                if "val/test_score" in metrics:
                    _refresh_dashboard(run_dir)
            if cfg.save_every and (step % cfg.save_every == 0 or step == cfg.steps):
                ahead_lib.save(
                    run.ckpt, step, device_state(state), run.prompts, run.ahead, producer
                )
            if stop_after is not None and step >= stop_after:
                break
        if state.step >= cfg.steps:
            learner = run.learner
            model = nnx.merge(learner.graphdef, learner.policy_params())
            export_final(model, run_dir, cfg.policy.checkpoint, tokenizer=learner.tokenizer)
    finally:
        if producer is not None:  # before the sampler it uses closes; a stop waits for
            producer.close()  # the batch being sampled, if any, to end
        close_run(run, writer)
    return records


def _producer(run: Run) -> RolloutProducer | None:
    """The overlapped rollout of `RLConfig.max_staleness` >= 1, not yet started."""
    cfg = run.cfg
    if not cfg.max_staleness:
        return None
    stage = None  # several processes: weights staged on this thread (overlap.py)
    if jax.process_count() > 1:
        if not run.rollout.stages_weights:
            raise ConfigError(
                f"RLConfig.max_staleness = {cfg.max_staleness} on {jax.process_count()} "
                f"processes needs a sampler that stages its weight push (stage_weights, "
                f"rollout/sampler.py); rollout.backend = {cfg.rollout.backend!r} has none: use "
                "the 'jax' backend or max_staleness = 0"
            )  # fmt: skip
        stage = run.rollout.stage_weights
        run.rollout.exchange_by_tag = True  # its gathers run on the producer's thread
    collect = lambda step, params, version, refresh: _collect(
        cfg, step, run.prompts, run.rollout, run.reward, params, version, refresh
    )
    first = run.learner.state.step + 1
    ready, run.ahead = run.ahead, {}  # the saved batches are the producer's to hand out
    return RolloutProducer(
        collect, run.prompts, first=first, last=cfg.steps, k=cfg.max_staleness, ready=ready,
        partial=cfg.partial_rollouts, stage=stage,
    )  # fmt: skip


def close_run(run: Run, writer: MetricsWriter | None = None) -> None:
    """Close everything a run holds (the sampler, its tool, the reward workers, the
    checkpointer, the writers), each even when another's close raises."""
    with contextlib.ExitStack() as stack:
        for close in (run.generations.close, run.rollout.close, run.reward.close,
                      *([run.val_reward.close] if run.val_reward else []),
                      run.ckpt.close, *([writer.close] if writer else [])):  # fmt: skip
            stack.callback(close)


def train_step(
    run: Run, step: int, producer: RolloutProducer | None = None, *, publish: bool = True
) -> dict[str, float]:
    """One RL step as data flow; returns its metrics (`timing/*` per phase). Device metrics
    stay on the device until the step's one transfer at the end (`_fetch`). With a
    `producer` the batch was sampled ahead (`timing/rollout_wait`: the time waited for it)
    and the updated weights go to it (`publish`; False: the caller publishes them after a
    validation, `_validate`)."""
    cfg, learner = run.cfg, run.learner
    t0 = time.perf_counter()
    if producer is None and step in run.ahead:  # saved by an overlapped run's checkpoint
        samples, metrics = run.ahead.pop(step)
    elif producer is None:
        # The weights after the learner's updates so far: the version the sampler checks.
        params = PolicyWeights(learner.policy_params(), learner.state.step + 1)
        samples, metrics = _collect(cfg, step, run.prompts, run.rollout, run.reward, params, step)
        # Generation and rewards; the weight hand-over is timed apart (timing/weight_sync).
        metrics["timing/rollout"] = time.perf_counter() - t0 - metrics["timing/weight_sync"]
    else:
        samples, metrics = producer.take(step)
    metrics.update(staleness_metrics(samples, step))
    same = all_equal_groups(samples.scores, cfg.rollout.n)
    metrics["batch/all_equal_groups_frac"] = float(same.mean())
    t1 = time.perf_counter()
    exp, device, padding = _make_experience(cfg, learner, samples)
    metrics.update(_experience_metrics(exp))
    metrics["perf/experience_padding_frac"] = padding
    # The phase timers' one barrier: the update consumes exp.batch, so waiting for it costs
    # only the overlap of dispatching the update's first call; without it the experience's
    # compute would be billed to timing/update.
    jax.block_until_ready(exp.batch)
    metrics["timing/experience"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    policy, critic, updates, metrics["perf/padding_frac"] = _update(cfg, learner, step, exp)
    learner.state.policy, learner.state.critic = policy, critic
    if producer is not None and publish:  # before the fetch below waits for the update
        producer.publish(step, policy.params, learner.frozen)
    # The step's one transfer; the update's metrics come out of its last program, so the
    # transfer also ends the update's timer (no separate wait on the params).
    metrics.update(_fetch({**{k: [v] for k, v in device.items()}, **updates}))
    metrics["timing/update"] = time.perf_counter() - t2
    _warn_skipped(step, metrics, cfg.algo.ppo_epochs * cfg.algo.mini_batches)
    metrics["timing/step"] = time.perf_counter() - t0
    metrics["perf/tokens_per_s"] = samples.num_tokens / metrics["timing/step"]
    record_step_samples(run.run_dir, step, samples)
    run.generations.write(step, samples)
    return metrics


def _validate(run: Run, producer: RolloutProducer | None = None, step: int = 0) -> dict[str, float]:
    """Greedy validation with the weights after step `step`; with a producer, between its
    batches of steps step + k and step + k + 1 (they share the sampler:
    `RolloutProducer.paused`)."""
    if run.data.val is None:
        return {}
    with producer.paused(step) if producer is not None else contextlib.nullcontext():
        run.rollout.sync_weights(run.learner.policy_params())
        try:
            reward = run.val_reward or run.reward  # `RLConfig.val_reward`, when set
            return run.rollout.validate(run.data.val, reward, run.cfg.reward.correct)
        finally:
            run.rollout.release_weights()


def _refresh_dashboard(run_dir: os.PathLike) -> None:
    """Rewrite run_dir/dashboard.png (process 0 only); a plotting error never stops training."""
    if jax.process_index() != 0:
        return
    try:
        write_dashboard([run_dir], run_dir, per_group=False)
    except Exception as e:  # plots are a convenience; training goes on
        log.warning("dashboard not refreshed: %s", e)


def _collect(
    cfg: RLConfig,
    step: int,
    prompts: PromptIterator,
    rollout: RolloutStage,
    reward: Scorer,
    params: PolicyWeights,
    version: int,
    refresh: Refresh | None = None,
) -> tuple[Rollout, dict[str, float]]:
    """Rollouts and rewards for one step with the policy `params` (the synchronous weights
    of step `version`; with `refresh`, newer ones as they arrive: partial rollouts), and their
    metrics; DAPO dynamic sampling refills all-equal groups."""
    n = cfg.rollout.n
    want = cfg.data.prompts_per_step
    mixed: list[Rollout] = []  # groups with a learning signal
    equal: list[Rollout] = []  # all-equal groups, used only to top up a short batch
    tries = dropped = 0
    metrics: dict[str, float] = {}
    t0 = time.perf_counter()
    push = rollout.sync_weights(params)  # in place when it returns
    metrics["timing/weight_sync"] = time.perf_counter() - t0
    metrics["weight_sync/bytes"] = float(push.bytes)
    while True:
        tries += 1
        batch = next(prompts)
        got = rollout.generate(batch, step, tries, reward, version, refresh)  # scored
        if tries == 1:
            metrics.update(rollout.env_metrics(got))
        if not cfg.algo.dynamic_sampling:
            mixed.append(got)
            break
        same = all_equal_groups(got.scores, n)
        dropped += int(same.sum())
        mixed.append(got.select_groups(~same))
        equal.append(got.select_groups(same))
        have = sum(len(e.prompt_ids) for e in mixed)
        if have >= want or tries >= cfg.algo.max_sampling_tries:
            break
    metrics["dynamic_sampling/tries"] = tries
    metrics.update(rollout.reward_metrics())  # reward/errors, reward/timeouts of all tries
    metrics.update(rollout.tool_metrics(step))  # the tool's own counters (tools/*), all tries
    rollout.release_weights()  # the update may use the memory of a cast / gathered copy
    metrics.update(rollout.sampler.metrics())
    metrics["dynamic_sampling/dropped_groups"] = dropped
    have = sum(len(e.prompt_ids) for e in mixed)
    if have < want:
        log.warning(
            "step %d: only %d of %d prompts had mixed rewards after %d tries; the batch is "
            "topped up with all-equal groups (shapes are static; they add no gradient)",
            step, have, want, tries,
        )  # fmt: skip
        mixed += equal
    return Rollout.concat(mixed, want), metrics


def _make_experience(
    cfg: RLConfig, learner: Learner, samples: Rollout
) -> tuple[Experience, dict[str, Any], float]:
    """Rows on the host; they go to the mesh once (over ("data", "fsdp"),
    `hosts.put_batch`) for the experience pass, and the `TrainBatch` stays there. Returns
    the experience, its device metrics and the padding share of its forwards."""
    pad = learner.tokenizer.pad_token_id
    seqs = pack_sequences(samples.completions, cfg.seq_len, 0 if pad is None else pad)
    state, mesh = learner.state, learner.mesh
    B = len(samples.completions)
    packing = _packing(cfg, mesh, seqs.length, min(cfg.algo.micro_batch_size, B))
    loss_mask = seqs.response_mask
    if not cfg.algo.mask_tool_output:  # the ablation: tool output trained too
        loss_mask = loss_mask + seqs.tool_mask
    if cfg.algo.overlong_filter:
        loss_mask = loss_mask * (~seqs.truncated)[:, None]
    rows = lambda x: hosts.put_batch(x, hosts.batch_sharding(mesh, x.shape))
    critic = state.critic.params if state.critic is not None else None
    # An environment's per-turn rewards go on their turns' tokens; else each score on the
    # sample's last trained token (inside the experience pass).
    per_turn = any(c.turn_rewards for c in samples.completions)
    rewards = turn_token_rewards(samples.completions, cfg.seq_len) if per_turn else samples.scores
    batch, sequence_rewards, metrics = learner.experience_fn(
        learner.policy_params(), learner.ref_params, critic,
        rows(seqs.input_ids), rows(seqs.response_mask), rows(loss_mask),
        rows(rewards), rows(seqs.rollout_logprobs), _put_packing(mesh, packing),
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
    return exp, metrics, padding_fraction(seqs.length, packing, cfg.seq_len)


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


def _experience_metrics(exp: Experience) -> dict[str, float]:
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


def _update(
    cfg: RLConfig, learner: Learner, step: int, exp: Experience
) -> tuple[TrainState, TrainState | None, dict[str, list[jax.Array]], float]:
    """ppo_epochs x mini_batches updates of the learner's policy (and critic); each
    mini-batch is cut from the batch on the mesh as [M, mb, T] (`learner.micro_batches`) and
    packed (`_packing`). Returns the updated policy and critic states (the steps donate the
    ones they are given: the caller puts these in their place), each metric's values, one
    per update, and the padding share of the updates' forwards."""
    a, mesh, batch = cfg.algo, learner.mesh, exp.batch
    policy, critic = learner.state.policy, learner.state.critic
    B = batch.input_ids.shape[0]
    positions = 0
    mini = B // a.mini_batches
    out: dict[str, list[jax.Array]] = {}
    rng = np.random.default_rng([cfg.seed, step])
    progress = bar(f"update {step}", a.ppo_epochs * a.mini_batches, unit="mb")
    replicated = NamedSharding(mesh, PartitionSpec())
    for _ in range(a.ppo_epochs):
        order = rng.permutation(B).astype(np.int32)
        for k in range(a.mini_batches):
            rows = hosts.put_batch(order[k * mini : (k + 1) * mini], replicated)
            mb = learner.micro_batches(batch, rows)
            lengths = exp.length[order[k * mini : (k + 1) * mini]]
            packing = _packing(cfg, mesh, lengths, min(a.micro_batch_size, mini))
            positions += forward_positions(lengths.size, packing, cfg.seq_len)
            packing = _put_packing(mesh, packing)
            if learner.critic_step is not None:
                critic, cm = learner.critic_step(critic, mb, packing)
                _append(out, cm)
            policy, pm = learner.policy_step(policy, mb, packing, learner.frozen)
            _append(out, pm)
            progress.update()
    progress.close()
    out["actor/lr_step"] = [policy.step]
    return policy, critic, out, 1.0 - a.ppo_epochs * float(exp.length.sum()) / positions


def _append(out: dict[str, list[jax.Array]], metrics: dict[str, jax.Array]) -> None:
    for k, v in metrics.items():
        out.setdefault(k, []).append(v)


@jax.jit
def _means(values: list[list[jax.Array]]) -> jax.Array:
    return jnp.stack([jnp.mean(jnp.stack(v).astype(jnp.float32)) for v in values])


def _fetch(device: dict[str, list[jax.Array]]) -> dict[str, float]:
    """Each metric's mean over its values (one per update, or one), all stacked on the
    device first: a step's metrics come to the host in one transfer."""
    keys = list(device)
    values = hosts.to_host(_means([device[k] for k in keys]))
    return {k: float(v) for k, v in zip(keys, values, strict=True)}


def _warn_skipped(step: int, metrics: dict[str, float], updates: int) -> None:
    for role in ("actor", "critic"):
        skipped = round(metrics.get(f"{role}/skipped", 0.0) * updates)
        if skipped:
            log.warning(
                "step %d: non-finite %s loss or gradient in %d of %d mini-batch updates; "
                "those updates were skipped, parameters unchanged", step, role, skipped, updates,
            )  # fmt: skip

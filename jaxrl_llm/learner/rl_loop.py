"""The RL loop: orchestration only (the math lives in `algorithms/`, `experience.py`, `steps.py`).

One step: prompts -> rollout with the live params -> rewards -> old/ref logprobs and values
-> advantages -> ppo_epochs x mini-batches of critic and policy updates -> metrics ->
validation / checkpoint. Every random draw derives from `RLConfig.seed` and the step, so a
resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.assets import resolve_checkpoint
from jaxrl_llm.config import write_resolved_config
from jaxrl_llm.data.prompts import prompt_data
from jaxrl_llm.learner.checkpoint import Checkpointer
from jaxrl_llm.learner.experience import (
    all_equal_groups,
    make_advantage_fn,
    make_logprob_fn,
    make_value_fn,
    pack_sequences,
)
from jaxrl_llm.learner.optim import make_optimizer
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.learner.steps import make_critic_step, make_policy_step, to_micro_batches
from jaxrl_llm.metrics import MetricsWriter
from jaxrl_llm.metrics.health import HealthMonitor
from jaxrl_llm.metrics.plots import write_dashboard
from jaxrl_llm.metrics.progress import bar, summary_line
from jaxrl_llm.metrics.samples import record_step_samples
from jaxrl_llm.models import ValueModel, from_pretrained, load_tokenizer, save_pretrained
from jaxrl_llm.rewards.config import build_reward_pool
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.sharding import TRAIN_RULES, build_mesh, hosts
from jaxrl_llm.types import Experience, Rollout, TrainBatch

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunState:
    """What a checkpoint restores: device state plus host counters."""

    policy: TrainState
    critic: TrainState | None
    step: int = 0


def run_rl(cfg: RLConfig, *, resume: bool = False, stop_after: int | None = None) -> list[dict]:
    """Train; returns the metric records written this call. `stop_after` ends early (tests)."""
    cfg.validate()
    run_dir = Path(cfg.resolved_run_dir())
    mesh = build_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    src = resolve_checkpoint(cfg.policy.checkpoint)
    tokenizer = load_tokenizer(src)
    load = dict(dtype=cfg.policy.dtype, param_dtype=cfg.policy.param_dtype, mesh=mesh)
    policy = from_pretrained(src, rules=TRAIN_RULES, remat=cfg.policy.remat, **load)
    graphdef, params = nnx.split(policy)
    a = cfg.algo
    ref_params = jax.tree.map(jnp.copy, params) if cfg.needs_reference else None

    updates_per_step = a.ppo_epochs * a.mini_batches
    tx = make_optimizer(cfg.optim, cfg.steps * updates_per_step)
    state = RunState(TrainState.create(params, tx, jax.random.PRNGKey(cfg.seed)), None)
    critic_graphdef = critic_step = value_fn = None
    if cfg.uses_critic:
        critic_src = resolve_checkpoint(cfg.policy.critic_checkpoint or cfg.policy.checkpoint)
        critic = from_pretrained(critic_src, cls=ValueModel, rules=TRAIN_RULES, **load)
        critic_graphdef, critic_params = nnx.split(critic)
        ctx_ = make_optimizer(cfg.critic_optim, cfg.steps * updates_per_step)
        state.critic = TrainState.create(critic_params, ctx_, jax.random.PRNGKey(cfg.seed + 1))
        critic_step = make_critic_step(critic_graphdef, ctx_, a)
        value_fn = make_value_fn(critic_graphdef, a.micro_batch_size)

    policy_step = make_policy_step(graphdef, tx, a, cfg.rollout.temperature)
    logprob_fn = make_logprob_fn(graphdef, cfg.rollout.temperature, a.micro_batch_size)
    adv_fn = make_advantage_fn(a, cfg.rollout.n)

    data = prompt_data(cfg.data, tokenizer, run_dir)
    rollout = RolloutStage(
        cfg.rollout, policy, tokenizer, mesh, max_prompt_length=cfg.data.max_prompt_length,
        seed=cfg.seed, rollout_dtype=cfg.policy.rollout_dtype, corpus=data.corpus,
    )  # fmt: skip
    reward = build_reward_pool(cfg.reward)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    ckpt = Checkpointer(run_dir / "checkpoints")
    it = data.train.iterator()
    if resume and ckpt.latest_step() is not None:
        step0 = ckpt.latest_step()
        restored, extra = ckpt.restore(step0, _device_state(state))
        state.policy, state.critic = restored["policy"], restored.get("critic")
        it.set_state(extra["data"])
        state.step = step0
        log.info("resumed from %s step %d", ckpt.directory, step0)
    elif run_dir.joinpath("checkpoints").exists() and ckpt.latest_step() is not None:
        raise FileExistsError(
            f"{run_dir} already has checkpoints; pass --resume or choose another run_dir"
        )
    if jax.process_index() == 0:
        write_resolved_config(run_dir)
    writer = MetricsWriter(run_dir, resume_step=state.step if resume else None)
    health = HealthMonitor()
    records: list[dict] = []
    try:
        if state.step == 0 and cfg.eval_every:
            m = rollout.validate(state.policy.params, data.val, reward, cfg.reward.correct)
            writer.write(0, m)
            records.append({"step": 0, **m})
            _refresh_dashboard(run_dir)
        while state.step < cfg.steps:
            step = state.step + 1
            t0 = time.perf_counter()
            samples, metrics = _collect(cfg, step, it, rollout, reward, state.policy.params)
            # Generation and rewards; the weight hand-over is timed apart (timing/weight_sync).
            metrics["timing/rollout"] = time.perf_counter() - t0 - metrics["timing/weight_sync"]
            same = all_equal_groups(samples.scores, cfg.rollout.n)
            metrics["batch/all_equal_groups_frac"] = float(same.mean())
            t1 = time.perf_counter()
            exp = _make_experience(
                cfg, mesh, samples, pad_id, state, ref_params, logprob_fn, value_fn, adv_fn
            )
            metrics.update(_experience_metrics(exp))
            metrics["timing/experience"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            metrics.update(_update(cfg, mesh, step, state, exp.batch, policy_step, critic_step))
            metrics["timing/update"] = time.perf_counter() - t2
            metrics["timing/step"] = time.perf_counter() - t0
            metrics["perf/tokens_per_s"] = samples.num_tokens / metrics["timing/step"]
            record_step_samples(run_dir, step, samples)
            state.step = step
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
                t3 = time.perf_counter()
                metrics.update(
                    rollout.validate(state.policy.params, data.val, reward, cfg.reward.correct)
                )
                metrics["timing/validate"] = time.perf_counter() - t3
            writer.write(step, metrics)
            records.append({"step": step, **metrics})
            log.info(summary_line(step, metrics))
            if jax.process_index() == 0:
                health.check(step, metrics)
                if "val/test_score" in metrics:
                    _refresh_dashboard(run_dir)
            if cfg.save_every and (step % cfg.save_every == 0 or step == cfg.steps):
                ckpt.save(step, _device_state(state), {"data": it.get_state(), "step": step})
            if stop_after is not None and step >= stop_after:
                break
        if state.step >= cfg.steps:
            model = nnx.merge(graphdef, state.policy.params)
            save_pretrained(model, run_dir / "hf", tokenizer=tokenizer)
    finally:
        writer.close()
        ckpt.close()
        reward.close()
    return records


def _refresh_dashboard(run_dir: Path) -> None:
    """Rewrite run_dir/dashboard.png (process 0 only); a plotting error never stops training."""
    if jax.process_index() != 0:
        return
    try:
        write_dashboard([run_dir], run_dir, per_group=False)
    except Exception as e:  # plots are a convenience; training goes on
        log.warning("dashboard not refreshed: %s", e)


def _device_state(state: RunState) -> dict[str, Any]:
    out: dict[str, Any] = {"policy": state.policy}
    if state.critic is not None:
        out["critic"] = state.critic
    return out


def _collect(cfg, step, it, rollout, reward, params):
    """Rollouts and rewards for one step; DAPO dynamic sampling refills all-equal groups."""
    n = cfg.rollout.n
    want = cfg.data.prompts_per_step
    mixed: list[Rollout] = []  # groups with a learning signal
    equal: list[Rollout] = []  # all-equal groups, used only to top up a short batch
    tries = dropped = 0
    metrics: dict[str, float] = {}
    t0 = time.perf_counter()
    params = jax.block_until_ready(rollout.sync_weights(params))
    metrics["timing/weight_sync"] = time.perf_counter() - t0
    while True:
        tries += 1
        batch = next(it)
        got = rollout.generate(params, batch, step, tries, reward)  # the whole batch, scored
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
    cfg, mesh, samples: Rollout, pad_id, state, ref_params, logprob_fn, value_fn, adv_fn
) -> Experience:
    """Packing on the host, the forwards and advantages on the mesh (rows over ("data",
    "fsdp"), `hosts.put_batch`); the `TrainBatch` comes back as numpy on every host."""
    packed = pack_sequences(samples.completions, cfg.seq_len, pad_id)
    loss_mask = packed["response_mask"]
    if cfg.algo.overlong_filter:
        loss_mask = loss_mask * (~packed["truncated"])[:, None]
    rows = lambda x: hosts.put_batch(x, hosts.batch_sharding(mesh, x.shape))
    ids, mask = rows(packed["input_ids"]), rows(loss_mask)
    old_lp = logprob_fn(state.policy.params, ids)
    ref_lp = logprob_fn(ref_params, ids) if ref_params is not None else jnp.zeros_like(old_lp)
    values = value_fn(state.critic.params, ids) if value_fn is not None else None
    adv, returns, token_rewards = adv_fn(rows(samples.scores), mask, old_lp, ref_lp, values)
    old_lp = hosts.to_host(old_lp)
    batch = TrainBatch(
        input_ids=packed["input_ids"],
        loss_mask=np.asarray(loss_mask, np.float32),
        old_logprobs=old_lp,
        ref_logprobs=hosts.to_host(ref_lp),
        advantages=hosts.to_host(adv),
        returns=hosts.to_host(returns),
        old_values=hosts.to_host(values) if values is not None else np.zeros_like(old_lp),
        rollout_logprobs=packed["rollout_logprobs"],
    )
    return Experience(
        rollout=samples,
        batch=batch,
        model_mask=packed["response_mask"],
        response_length=packed["response_length"],
        truncated=packed["truncated"],
        sequence_rewards=hosts.to_host(token_rewards).sum(-1),
        has_values=values is not None,
    )


def _experience_metrics(exp: Experience) -> dict[str, float]:
    batch, scores, lengths = exp.batch, exp.rollout.scores, exp.response_length
    mask = np.asarray(batch.loss_mask)
    adv = np.asarray(batch.advantages)[mask > 0]
    diff = np.abs(np.asarray(batch.old_logprobs) - np.asarray(batch.rollout_logprobs))
    diff = diff[exp.model_mask > 0]
    m = {
        "critic/score/mean": scores.mean(),
        "critic/score/max": scores.max(),
        "critic/score/min": scores.min(),
        "critic/rewards/mean": exp.sequence_rewards.mean(),
        "critic/advantages/mean": adv.mean() if adv.size else 0.0,
        "critic/advantages/max": adv.max() if adv.size else 0.0,
        "critic/advantages/min": adv.min() if adv.size else 0.0,
        "response_length/mean": lengths.mean(),
        "response_length/max": lengths.max(),
        "response_length/min": lengths.min(),
        "response_length/clip_ratio": exp.truncated.mean(),
        "rollout/logprob_diff/mean": diff.mean() if diff.size else 0.0,
        "rollout/logprob_diff/max": diff.max() if diff.size else 0.0,
    }
    if exp.has_values:
        vals = np.asarray(batch.old_values)[mask > 0]
        rets = np.asarray(batch.returns)[mask > 0]
        m["critic/values/mean"] = vals.mean() if vals.size else 0.0
        m["critic/returns/mean"] = rets.mean() if rets.size else 0.0
    return {k: float(v) for k, v in m.items()}


def _update(cfg, mesh, step, state: RunState, batch: TrainBatch, policy_step, critic_step):
    """ppo_epochs x mini_batches updates; each mini-batch is cut on the host and goes to the
    mesh as [M, mb, T] (`hosts.put_batch`: the mb rows over ("data", "fsdp"))."""
    a = cfg.algo
    B = batch.input_ids.shape[0]
    mini = B // a.mini_batches
    sums: dict[str, float] = {}
    count = 0
    rng = np.random.default_rng([cfg.seed, step])
    progress = bar(f"update {step}", a.ppo_epochs * a.mini_batches, unit="mb")
    for _ in range(a.ppo_epochs):
        order = rng.permutation(B)
        for k in range(a.mini_batches):
            host = to_micro_batches(batch, order[k * mini : (k + 1) * mini], a.micro_batch_size)
            mb = jax.tree.map(
                lambda x: hosts.put_batch(x, hosts.batch_sharding(mesh, x.shape, axis=1)),
                host,
            )
            cm: dict[str, Any] = {}
            if critic_step is not None:
                state.critic, cm = critic_step(state.critic, mb)
                _add(sums, cm)
            state.policy, pm = policy_step(state.policy, mb)
            _add(sums, pm)
            count += 1
            progress.set_postfix(pg_loss=f"{float(pm['actor/pg_loss']):.4f}")
            progress.update()
            for role, m in (("actor", pm), ("critic", cm)):
                if float(m.get(f"{role}/skipped", 0.0)):
                    log.warning(
                        "step %d: non-finite %s loss or gradient in a mini-batch; "
                        "that update was skipped, parameters unchanged", step, role,
                    )  # fmt: skip
    progress.close()
    out = {k: v / count for k, v in sums.items()}
    out["actor/lr_step"] = float(state.policy.step)
    return out


def _add(sums: dict[str, float], metrics: dict[str, Any]) -> None:
    for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + float(v)

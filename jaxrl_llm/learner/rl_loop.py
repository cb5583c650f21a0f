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

import jax
import numpy as np
from flax import nnx

from jaxrl_llm.algorithms import adaptive_kl_coef, registry
from jaxrl_llm.config import write_resolved_config
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.pipeline import PromptIterator
from jaxrl_llm.learner import ahead as ahead_lib
from jaxrl_llm.learner import learn
from jaxrl_llm.learner.experience import (
    all_equal_groups,
)
from jaxrl_llm.learner.export import export_final
from jaxrl_llm.learner.overlap import RolloutProducer, staleness_metrics
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.run import Run, build_run, device_state
from jaxrl_llm.metrics import MetricsWriter
from jaxrl_llm.metrics.health import HealthMonitor
from jaxrl_llm.metrics.plots import write_dashboard
from jaxrl_llm.metrics.progress import summary_line
from jaxrl_llm.metrics.samples import record_step_samples
from jaxrl_llm.rewards.pool import Scorer
from jaxrl_llm.rollout.sampler import PolicyWeights, Refresh
from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.types import Rollout

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
        resumed = run.resumed and state.step > 0  # else a fresh start: no record is kept
        writer = MetricsWriter(run_dir, resume_step=state.step if resumed else None)
        producer = _producer(run)
    except BaseException:
        close_run(run)
        raise
    health = HealthMonitor()
    records: list[dict] = []
    undrawn = False  # a record written since dashboard.png was last drawn
    try:
        if state.step == 0 and cfg.eval_every:
            records += _first_validation(run, writer)  # the producer starts after it
        if producer is not None:
            producer.start(state.policy.params, run.learner.frozen)
        while state.step < cfg.steps:
            step = state.step + 1
            evaluate = bool(cfg.eval_every) and (step % cfg.eval_every == 0 or step == cfg.steps)
            metrics = train_step(run, step, producer, publish=not evaluate)
            if step == 1:  # what building the training data kept and dropped, logged once
                metrics.update(run.data.train.report.as_metrics())
            state.step = step
            if evaluate:
                t0 = time.perf_counter()
                metrics.update(_validate(run, producer, step))
                metrics["timing/validate"] = time.perf_counter() - t0
                if producer is not None:  # held back until validation has the sampler
                    producer.publish(step, state.policy.params, run.learner.frozen)
            writer.write(step, metrics)
            records.append({"step": step, **metrics})
            undrawn = True
            log.info(summary_line(step, metrics))
            if jax.process_index() == 0:
                health.check(step, metrics)
            if "val/test_score" in metrics:  # redrawn after each validation, and at the end
                _refresh_dashboard(run_dir)
                undrawn = False
            if cfg.save_every and (step % cfg.save_every == 0 or step == cfg.steps):
                ahead_lib.save(
                    run.ckpt,
                    step,
                    device_state(state),
                    run.prompts,
                    run.ahead,
                    producer,
                    kl_coef=state.kl_coef,
                )
            if stop_after is not None and step >= stop_after:
                break
        if state.step >= cfg.steps:
            learner = run.learner
            model = nnx.merge(learner.graphdef, learner.policy_params())
            export_final(model, run_dir, cfg.policy.checkpoint, tokenizer=learner.tokenizer)
    finally:
        try:
            if producer is not None:  # before the sampler it uses closes; a stop waits for
                producer.close()  # the batch being sampled, if any, to end
            close_run(run, writer)
        finally:  # however the loop ended (an error too), the dashboard shows every record
            if undrawn:
                _refresh_dashboard(run_dir)
    return records


def _first_validation(run: Run, writer: MetricsWriter) -> list[dict]:
    """Step 0's record: the validation of the initial policy, written and drawn; none when
    the run has no validation data."""
    metrics = _validate(run)
    if not metrics:
        return []
    writer.write(0, metrics)
    _refresh_dashboard(run.run_dir)
    return [{"step": 0, **metrics}]


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
        cfg, step, run.prompts, run.rollout, run.reward, params, version, refresh,
        run_dir=run.run_dir,
    )  # fmt: skip
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
    stay on the device until the step's one transfer at the end (`learn.fetch`). With a
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
        samples, metrics = _collect(
            cfg, step, run.prompts, run.rollout, run.reward, params, step, run_dir=run.run_dir
        )
        # Generation and rewards; the weight hand-over is timed apart (timing/weight_sync).
        metrics["timing/rollout"] = time.perf_counter() - t0 - metrics["timing/weight_sync"]
    else:
        samples, metrics = producer.take(step)
    metrics.update(staleness_metrics(samples, step))
    metrics.update(group_metrics(cfg, samples.scores))
    t1 = time.perf_counter()
    exp, device, padding, plan = learn.make_experience(cfg, learner, samples, step)
    metrics.update(learn.host_metrics(exp))
    metrics["perf/experience_padding_frac"] = padding
    # The phase timers' one barrier: the update consumes exp.batch, so waiting for it costs
    # only the overlap of dispatching the update's first call; without it the experience's
    # compute would be billed to timing/update.
    jax.block_until_ready(exp.batch)
    metrics["timing/experience"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    policy, critic, updates, metrics["perf/padding_frac"] = learn.update(
        cfg, learner, step, exp, plan
    )
    learner.state.policy, learner.state.critic = policy, critic
    if producer is not None and publish:  # before the fetch below waits for the update
        producer.publish(step, policy.params, learner.frozen)
    # The step's one transfer; the update's metrics come out of its last program, so the
    # transfer also ends the update's timer (no separate wait on the params).
    metrics.update(learn.fetch(device, updates))
    metrics["timing/update"] = time.perf_counter() - t2
    state = learner.state
    if state.kl_coef is not None:  # the adaptive KL controller
        kl = metrics["actor/reward_kl_penalty"]
        state.kl_coef = adapt_kl_coef(cfg.algo, state.kl_coef, kl, len(samples.completions))
    learn.warn_skipped(step, metrics, cfg.algo.ppo_epochs * cfg.algo.mini_batches)
    metrics["timing/step"] = time.perf_counter() - t0
    metrics["perf/tokens_per_s"] = samples.num_tokens / metrics["timing/step"]
    run.generations.write(step, samples)
    return metrics


def adapt_kl_coef(algo, coef: float, kl: float, samples: int) -> float:
    """The next step's KL-in-the-reward weight from verl's adaptive controller
    (`algorithms.adaptive_kl_coef`, `AlgoConfig.kl_in_reward_target` and `_horizon`) fed the
    step's KL (`actor/reward_kl_penalty`), n_steps = the step's samples as verl's
    `apply_kl_penalty` passes its batch size."""
    new = adaptive_kl_coef(
        coef, kl, samples, target_kl=algo.kl_in_reward_target, horizon=algo.kl_in_reward_horizon
    )
    return float(new)


def group_metrics(cfg: RLConfig, scores: np.ndarray) -> dict[str, float]:
    """`batch/all_equal_groups_frac`: the fraction of prompt groups whose `rollout.n` scores
    are all equal, so a group baseline gives them advantage 0. Only for an estimator
    registered with a group baseline (`group_baseline`: GRPO, RLOO, REINFORCE++-baseline)
    and n > 1; empty otherwise (a critic's or a batch baseline reads no groups, and with
    n = 1 every "group" is one sample)."""
    n = cfg.rollout.n
    if n < 2 or not registry.capabilities("advantage", cfg.algo.estimator).group_baseline:
        return {}
    return {"batch/all_equal_groups_frac": float(all_equal_groups(scores, n).mean())}


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
    *,
    run_dir: os.PathLike,
) -> tuple[Rollout, dict[str, float]]:
    """Rollouts and rewards for one step with the policy `params` (the synchronous weights
    of step `version`; with `refresh`, newer ones as they arrive: partial rollouts), and their
    metrics; DAPO dynamic sampling refills all-equal groups. The per-sample metrics
    (`rollout/finish/*`, `env/tool_calls/mean`, ...: `RolloutStage.env_metrics`) describe
    the samples returned, which are trained; the counters (`reward/*`, `tools/*`, the
    environments' `env/{turns,calls}/mean`) every try's.

    Every batch drawn is recorded for LIMR in `run_dir` as it was sampled, before any group
    is dropped, under its position in the data order (`samples/step_<index + 1>.jsonl`):
    record i is then batch i of the data, and the records of each epoch hold each of its
    prompts once, also when dynamic sampling draws several batches per step (without it,
    record i is step i's batch)."""
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
        record_step_samples(run_dir, batch.index + 1, got)  # LIMR's record of this batch
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
    trained = Rollout.concat(mixed, want)
    metrics.update(rollout.env_metrics(trained))  # finish shares, tool calls: the trained samples
    return trained, metrics

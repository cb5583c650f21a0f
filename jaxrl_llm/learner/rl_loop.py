"""The RL loop: orchestration only (the math lives in `algorithms/`, `experience.py`, `steps.py`).

One step: prompts -> rollout with the live params -> rewards -> old/ref logprobs and values
-> advantages -> ppo_epochs x mini-batches of critic and policy updates -> metrics ->
validation / checkpoint. Every random draw derives from `RLConfig.seed` and the step, so a
resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.config import write_resolved_config
from jaxrl_llm.learner.experience import (
    all_equal_groups,
    pack_sequences,
)
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.run import Learner, Run, RunState, build_run, device_state
from jaxrl_llm.learner.steps import to_micro_batches
from jaxrl_llm.metrics import MetricsWriter
from jaxrl_llm.metrics.health import HealthMonitor
from jaxrl_llm.metrics.plots import write_dashboard
from jaxrl_llm.metrics.progress import bar, summary_line
from jaxrl_llm.metrics.samples import record_step_samples
from jaxrl_llm.models import save_pretrained
from jaxrl_llm.sharding import hosts
from jaxrl_llm.types import Experience, Rollout, TrainBatch

log = logging.getLogger(__name__)


def run_rl(cfg: RLConfig, *, resume: bool = False, stop_after: int | None = None) -> list[dict]:
    """Train; returns the metric records written this call. `stop_after` ends early (tests)."""
    return train(build_run(cfg, resume=resume), stop_after=stop_after)


def train(run: Run, *, stop_after: int | None = None) -> list[dict]:
    """Step until `cfg.steps`: rollout -> experience -> update, then log / validate / save."""
    cfg, state, run_dir = run.cfg, run.learner.state, run.run_dir
    if jax.process_index() == 0:
        write_resolved_config(run_dir)
    writer = MetricsWriter(run_dir, resume_step=state.step if run.resumed else None)
    health = HealthMonitor()
    records: list[dict] = []
    try:
        if state.step == 0 and cfg.eval_every:
            m = _validate(run)
            writer.write(0, m)
            records.append({"step": 0, **m})
            _refresh_dashboard(run_dir)
        while state.step < cfg.steps:
            step = state.step + 1
            metrics = train_step(run, step)
            state.step = step
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
                t0 = time.perf_counter()
                metrics.update(_validate(run))
                metrics["timing/validate"] = time.perf_counter() - t0
            writer.write(step, metrics)
            records.append({"step": step, **metrics})
            log.info(summary_line(step, metrics))
            if jax.process_index() == 0:
                health.check(step, metrics)
                if "val/test_score" in metrics:
                    _refresh_dashboard(run_dir)
            if cfg.save_every and (step % cfg.save_every == 0 or step == cfg.steps):
                extra = {"data": run.prompts.get_state(), "step": step}
                run.ckpt.save(step, device_state(state), extra)
            if stop_after is not None and step >= stop_after:
                break
        if state.step >= cfg.steps:
            model = nnx.merge(run.learner.graphdef, state.policy.params)
            save_pretrained(model, run_dir / "hf", tokenizer=run.learner.tokenizer)
    finally:
        writer.close()
        run.ckpt.close()
        run.reward.close()
    return records


def train_step(run: Run, step: int) -> dict[str, float]:
    """One RL step as data flow; returns its metrics (`timing/*` per phase)."""
    cfg, lr = run.cfg, run.learner
    t0 = time.perf_counter()
    samples, metrics = _collect(cfg, step, run.prompts, run.rollout, run.reward, lr.state)
    # Generation and rewards; the weight hand-over is timed apart (timing/weight_sync).
    metrics["timing/rollout"] = time.perf_counter() - t0 - metrics["timing/weight_sync"]
    same = all_equal_groups(samples.scores, cfg.rollout.n)
    metrics["batch/all_equal_groups_frac"] = float(same.mean())
    t1 = time.perf_counter()
    exp = _make_experience(cfg, lr, samples)
    metrics.update(_experience_metrics(exp))
    metrics["timing/experience"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    metrics.update(_update(cfg, lr, step, exp.batch))
    metrics["timing/update"] = time.perf_counter() - t2
    metrics["timing/step"] = time.perf_counter() - t0
    metrics["perf/tokens_per_s"] = samples.num_tokens / metrics["timing/step"]
    record_step_samples(run.run_dir, step, samples)
    return metrics


def _validate(run: Run) -> dict[str, float]:
    params = run.learner.state.policy.params
    return run.rollout.validate(params, run.data.val, run.reward, run.cfg.reward.correct)


def _refresh_dashboard(run_dir: Path) -> None:
    """Rewrite run_dir/dashboard.png (process 0 only); a plotting error never stops training."""
    if jax.process_index() != 0:
        return
    try:
        write_dashboard([run_dir], run_dir, per_group=False)
    except Exception as e:  # plots are a convenience; training goes on
        log.warning("dashboard not refreshed: %s", e)


def _collect(cfg, step, it, rollout, reward, state: RunState):
    """Rollouts and rewards for one step; DAPO dynamic sampling refills all-equal groups."""
    n = cfg.rollout.n
    want = cfg.data.prompts_per_step
    mixed: list[Rollout] = []  # groups with a learning signal
    equal: list[Rollout] = []  # all-equal groups, used only to top up a short batch
    tries = dropped = 0
    metrics: dict[str, float] = {}
    t0 = time.perf_counter()
    params = jax.block_until_ready(rollout.sync_weights(state.policy.params))
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


def _make_experience(cfg, lr: Learner, samples: Rollout) -> Experience:
    """Packing on the host, the forwards and advantages on the mesh (rows over ("data",
    "fsdp"), `hosts.put_batch`); the `TrainBatch` comes back as numpy on every host."""
    pad = lr.tokenizer.pad_token_id
    packed = pack_sequences(samples.completions, cfg.seq_len, 0 if pad is None else pad)
    state, mesh = lr.state, lr.mesh
    loss_mask = packed["response_mask"]
    if cfg.algo.overlong_filter:
        loss_mask = loss_mask * (~packed["truncated"])[:, None]
    rows = lambda x: hosts.put_batch(x, hosts.batch_sharding(mesh, x.shape))
    ids, mask = rows(packed["input_ids"]), rows(loss_mask)
    old_lp = lr.logprob_fn(state.policy.params, ids)
    ref = lr.ref_params
    ref_lp = lr.logprob_fn(ref, ids) if ref is not None else jnp.zeros_like(old_lp)
    values = None
    if lr.value_fn is not None:
        assert state.critic is not None  # built with value_fn (`build_learner`)
        values = lr.value_fn(state.critic.params, ids)
    adv, returns, token_rewards = lr.adv_fn(rows(samples.scores), mask, old_lp, ref_lp, values)
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


def _update(cfg, lr: Learner, step: int, batch: TrainBatch[np.ndarray]) -> dict[str, float]:
    """ppo_epochs x mini_batches updates; each mini-batch is cut on the host and goes to the
    mesh as [M, mb, T] (`hosts.put_batch`: the mb rows over ("data", "fsdp"))."""
    a, state, mesh = cfg.algo, lr.state, lr.mesh
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
            if lr.critic_step is not None:
                state.critic, cm = lr.critic_step(state.critic, mb)
                _add(sums, cm)
            state.policy, pm = lr.policy_step(state.policy, mb)
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

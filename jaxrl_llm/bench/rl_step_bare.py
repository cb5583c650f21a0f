"""The bare baseline of `jaxrl-llm bench rl-step` (`bench/rl_step.py` says what it counts):
the run's own jitted kernels on the step's shapes, with no host logic, tools or rewards,
each warmed up until a call compiles nothing, then timed `repeats` times (the median)."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from jaxrl_llm.bench.clock import CompileClock


def _warm(fn, clock: CompileClock) -> None:
    """Call until a call compiles nothing: on a multi-device mesh a fresh `TrainState`
    compiles the policy step twice (its first output is laid out differently)."""
    import jax

    for _ in range(3):
        n = len(clock.events)
        jax.block_until_ready(fn())
        if len(clock.events) == n:
            return


def _median_time(fn, repeats: int, clock: CompileClock) -> float:
    import jax

    _warm(fn, clock)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bare_rollout(cfg, policy, tokenizer, mesh, params, shape, repeats, clock) -> dict:
    """Prefill + insert time for the step's prompts and samples, and one decode call's time."""
    import jax

    from jaxrl_llm.rollout import Engine, SamplingParams
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.sampling import SlotSampling
    from jaxrl_llm.rollout.stage import RolloutStage

    # The bare baseline is our engine's kernels whatever the run's backend: a vLLM run's
    # rollout phase reads as a ratio to the same JAX kernels.
    r = dataclasses.replace(cfg.rollout, backend="jax")
    rollout = RolloutStage(  # the run's engine sizes and weight sync
        r, policy, tokenizer, mesh, max_prompt_length=cfg.data.max_prompt_length,
        seed=cfg.seed, rollout_dtype=cfg.policy.rollout_dtype,
    )  # fmt: skip
    rollout.sync_weights(params)
    sampler = rollout.sampler
    assert isinstance(sampler, JaxSampler)  # the bare engine's costs, for the JAX backend
    params, sizes = sampler.params, sampler.engine
    engine = Engine(
        policy,
        max_concurrent_decodes=sizes.batch,
        max_cache_length=sizes.cache_length,
        max_prefill_length=sizes.max_prefill_length,
        mesh=mesh,
        eos_ids=(),  # every row decodes its whole budget
        keep_params=False,
    )
    S, slots = engine.cache_length, engine.batch
    P = min(shape["prompt_len_mean"], engine.max_prefill_length)
    width = engine.prefill_bucket(P)
    rng = np.random.RandomState(0)
    prompts = rng.randint(3, policy.config.vocab_size, (shape["prompts"], width)).astype(np.int32)
    sp = SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p)
    sampling = [SlotSampling.one(sp, k) for k in range(shape["samples"])]
    calls = max(1, min(8, (S - 1 - P) // r.steps_per_call))  # stays inside the cache

    def fill():
        placed = engine.place_params(params)  # as the driver does once per generate()
        state = engine.init_decode_state()
        for i in range(shape["prompts"]):
            prefix = engine.prefill(params=placed, padded_tokens=prompts[i], true_length=P)
            for j in range(r.n):
                k = i * r.n + j  # past the last slot, rows overwrite earlier ones: same cost
                state = engine.insert_slot(prefix, state, k % slots, sampling[k], S)
        return placed, state

    def decode() -> float:
        placed, state = jax.block_until_ready(fill())
        t0 = time.perf_counter()
        for _ in range(calls):
            state, rec = engine.generate_steps(placed, state, r.steps_per_call)
        jax.block_until_ready(rec)
        return time.perf_counter() - t0

    fill_s = _median_time(fill, repeats, clock)
    _warm(decode, clock)
    call_s = statistics.median(decode() for _ in range(max(1, repeats))) / calls
    n_calls = lambda steps: math.ceil(steps / r.steps_per_call)
    return {
        "prefill_insert_s": fill_s,
        "decode_call_s": call_s,
        "prefill_width": width,
        "rollout_s": fill_s + n_calls(shape["decode_steps"]) * call_s,
        "rollout_tail_s": fill_s + n_calls(shape["decode_steps_tail"]) * call_s,
    }


def bare_train(cfg, learner, shape, repeats, clock) -> dict:
    """The run's own jitted experience pass and policy updates (`learner`, as
    `build_learner` makes them for `run_rl`) on the step's batch shapes: every row a
    prompt of the mean prompt length, then a response of the mean response length."""
    import jax.numpy as jnp

    a, lr = cfg.algo, learner
    params, vocab = lr.state.policy.params, lr.policy.config.vocab_size
    B, T = shape["samples"], shape["seq_len"]
    P = shape["prompt_len_mean"]
    R = max(1, min(T - P, round(shape["response_len_mean"])))
    ids = jnp.asarray(np.random.RandomState(1).randint(3, vocab, (B, T)).astype(np.int32))
    mask = jnp.zeros((B, T), jnp.float32).at[:, P : P + R].set(1.0)
    scores = jnp.asarray(np.random.RandomState(2).randint(0, 2, B).astype(np.float32))
    ref = params if cfg.needs_reference else None
    zeros = jnp.zeros((B, T), jnp.float32)
    experience = lambda: lr.experience_fn(params, ref, None, ids, mask, mask, scores, zeros)
    experience_s = _median_time(experience, repeats, clock)
    batch, _, _ = experience()
    mb = lr.micro_batches(batch, jnp.arange(B // a.mini_batches))
    updates = a.ppo_epochs * a.mini_batches
    # The step donates its state: the experience timings above are done with `params`.
    holder = {"state": lr.state.policy}

    def update():
        for _ in range(updates):
            holder["state"], m = lr.policy_step(holder["state"], mb)
        return m

    return {
        "experience_s": experience_s,
        "experience_forwards": int(not lr.on_policy) + int(ref is not None),
        "update_s": _median_time(update, repeats, clock),
        "updates": updates,
        "micro_batches": int(mb.input_ids.shape[0]),
    }


def bare_kernels(cfg, shape: dict, repeats: int, clock: CompileClock) -> dict:
    """Builds the run's learner as `run_rl` does and times the bare rollout and train
    kernels."""
    from jaxrl_llm.learner.run import build_learner

    lr = build_learner(cfg)
    params = lr.state.policy.params
    out = bare_rollout(cfg, lr.policy, lr.tokenizer, lr.mesh, params, shape, repeats, clock)
    return {**out, **bare_train(cfg, lr, shape, repeats, clock)}

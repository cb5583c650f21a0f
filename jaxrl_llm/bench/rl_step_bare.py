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


def running_decode_s(fill, call, wait, n_calls: int, calls_per_fill: int,
                     clock=time.perf_counter) -> list[float]:  # fmt: skip
    """Decode seconds from a fresh `fill()` to the end of each of `n_calls` calls, in order.

    The calls are dispatched back to back (`call(state) -> (state, records)`), as the driver
    does, and each one's records are waited for in turn (`wait`), so entry i is when call i
    ended: each call is counted at its own row length (the paged engine reads only the
    pages a row holds, so a call over long rows costs more). After `calls_per_fill` calls the
    rows' cache is full: they are filled again, untimed, and the total goes on from there,
    as a slot takes its next sample."""
    totals: list[float] = []
    while len(totals) < n_calls:
        state, done = fill(), (totals[-1] if totals else 0.0)
        t0, records = clock(), []
        for _ in range(min(calls_per_fill, n_calls - len(totals))):
            state, rec = call(state)
            records.append(rec)
        for rec in records:
            wait(rec)
            totals.append(done + clock() - t0)
    return totals


def rollout_seconds(fill_s: float, totals: list[float], shape: dict, steps_per_call: int) -> dict:
    """The bare rollout's fields from the fill's seconds and the running decode totals
    (`running_decode_s`), each read at the calls its decode steps need."""
    n_calls = lambda steps: math.ceil(steps / steps_per_call)
    decode_s = totals[n_calls(shape["decode_steps"]) - 1]
    decode_tail_s = totals[n_calls(shape["decode_steps_tail"]) - 1]
    return {
        "prefill_insert_s": fill_s,
        "decode_s": decode_s,
        "decode_tail_s": decode_tail_s,
        "decode_calls": n_calls(shape["decode_steps_tail"]),
        "rollout_s": fill_s + decode_s,
        "rollout_tail_s": fill_s + decode_tail_s,
    }


def bare_rollout(cfg, policy, tokenizer, mesh, params, shape, repeats, clock) -> dict:
    """Prefill + insert time for the step's prompts and samples, then the decode calls'
    running time from there (`running_decode_s`), read at the step's two lengths."""
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
    S, slots, spc = engine.cache_length, engine.batch, r.steps_per_call
    P = min(shape["prompt_len_mean"], engine.max_prefill_length)
    width = engine.prefill_bucket(P)
    rng = np.random.RandomState(0)
    prompts = rng.randint(3, policy.config.vocab_size, (shape["prompts"], width)).astype(np.int32)
    sp = SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p)
    sampling = [SlotSampling.one(sp, k) for k in range(shape["samples"])]
    per_fill = max(1, (S - 1 - P) // spc)  # calls before the rows reach the cache's end

    def fill():
        placed = engine.place_params(params)  # as the driver does once per generate()
        state = engine.init_decode_state()
        for i in range(shape["prompts"]):
            prefix = engine.prefill(params=placed, padded_tokens=prompts[i], true_length=P)
            for j in range(r.n):
                k = i * r.n + j  # past the last slot, rows overwrite earlier ones: same cost
                state = engine.insert_slot(prefix, state, k % slots, sampling[k], S)
        return placed, state

    placed = {}

    def filled():
        placed["params"], state = jax.block_until_ready(fill())
        return state

    call = lambda state: engine.generate_steps(placed["params"], state, spc)
    decode = lambda n: running_decode_s(filled, call, jax.block_until_ready, n, per_fill)
    fill_s = _median_time(fill, repeats, clock)
    _warm(lambda: decode(1), clock)
    n = math.ceil(shape["decode_steps_tail"] / spc)
    runs = [decode(n) for _ in range(max(1, repeats))]
    totals = [statistics.median(t) for t in zip(*runs)]  # per call, over the repeats
    return {**rollout_seconds(fill_s, totals, shape, spc), "prefill_width": width}


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
        metrics = []
        for _ in range(updates):
            holder["state"], m = lr.policy_step(holder["state"], mb)
            metrics.append(m)
        return metrics[-1]

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

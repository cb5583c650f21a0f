"""Policy/critic update steps: sharded == unsharded, NaN batches skipped, split-invariant,
equal to the full-logits loss, the on-policy shortcut equal to the full path."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrl_llm.algorithms as alg
from jaxrl_llm.learner import steps
from jaxrl_llm.learner.experience import make_experience_fn, shift_right
from jaxrl_llm.learner.rl_config import AlgoConfig
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.learner.steps import (
    make_critic_step,
    make_micro_batch_fn,
    make_policy_step,
    to_micro_batches,
)
from jaxrl_llm.models import ValueModel, init_model
from jaxrl_llm.sharding import build_mesh
from jaxrl_llm.sharding.hosts import batch_sharding
from jaxrl_llm.testing import (
    FLOAT32_EPS,
    aggregation_weights,
    as_float64,
    assert_as_accurate,
    float32_sum_tolerance,
    float64_twin,
    tiny_config,
)
from jaxrl_llm.types import TrainBatch

from .rl_helpers import random_rows

CFG = tiny_config()
B, T = 8, 12


def _batch(seed=0) -> TrainBatch:
    rng = np.random.default_rng(seed)
    ids, mask = random_rows(rng, B, T, CFG.vocab_size)
    f = lambda *s: rng.normal(size=s).astype(np.float32) * 0.1
    return TrainBatch(
        input_ids=jnp.asarray(ids),
        loss_mask=jnp.asarray(mask),
        old_logprobs=jnp.asarray(f(B, T) - 4.0),
        ref_logprobs=jnp.asarray(f(B, T) - 4.0),
        advantages=jnp.asarray(f(B, T) * 10),
        returns=jnp.asarray(f(B, T)),
        old_values=jnp.asarray(f(B, T)),
        rollout_logprobs=jnp.asarray(f(B, T) - 4.0),
    )


def _policy_state(model, tx):
    graphdef, params = nnx.split(model)
    params = jax.tree.map(jnp.copy, params)  # the step donates its state
    return graphdef, TrainState.create(params, tx, jax.random.PRNGKey(0))


ALGO = AlgoConfig(use_kl_loss=True, entropy_coef=0.01, is_cap=2.0)


def _run_policy(model, batch, micro, algo=ALGO, **kw):
    tx = optax.sgd(0.1)
    graphdef, state = _policy_state(model, tx)
    step = make_policy_step(graphdef, tx, algo, temperature=0.8, **kw)
    return step(state, to_micro_batches(batch, jnp.arange(B), micro))


def _exact_policy(model, batch, micro, algo=ALGO, **kw):
    """`_run_policy` in float64 on the same (upcast) weights and batch: the exact update the
    float32 programs are measured against (`testing.assert_as_accurate`)."""
    with jax.enable_x64(True):
        state, metrics = _run_policy(float64_twin(model), as_float64(batch), micro, algo, **kw)
        return jax.device_get((state.params, metrics))


def _assert_as_accurate(got, trusted, exact, keys=None):
    """`got`'s update (parameters, and the metrics `keys`) is as accurate as `trusted`'s
    against the float64 update `exact` (`testing.assert_as_accurate`)."""
    pick = lambda params, m: (params, {k: m[k] for k in keys or trusted[1]})
    (s1, m1), (s2, m2), (p3, m3) = got, trusted, exact
    worst = assert_as_accurate(pick(s1.params, m1), pick(s2.params, m2), pick(p3, m3))
    print(f"error / bound: {worst:.2f}")


@pytest.mark.slow  # measured: 8 s on 2 cores (docs/testing.md)
def test_sharded_policy_step_equals_unsharded():
    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    plain = init_model(CFG, seed=1)
    sharded = init_model(CFG, seed=1, mesh=mesh)
    batch = _batch()
    s1, m1 = _run_policy(plain, batch, 4)
    s2, m2 = _run_policy(sharded, batch, 4)
    # trusted: the unsharded step; exact: the same in float64
    _assert_as_accurate((s2, m2), (s1, m1), _exact_policy(plain, batch, 4))
    q = s2.params["model"]["layers"][0]["self_attn"]["q_proj"].get_value()
    assert q.sharding.spec[0] == "fsdp"  # the update kept the training layout


@pytest.mark.slow  # measured: 16 s alone on 2 cores
def test_an_update_keeps_the_state_layout():
    """XLA alone would give the new state another layout (on this mesh it shards the
    replicated norm weights and their moments over fsdp), and the next update, taking that
    state, would compile a second program."""
    mesh = build_mesh(data=2, fsdp=4, tensor=1)
    tx = optax.adam(1e-3)
    graphdef, state = _policy_state(init_model(CFG, seed=1, mesh=mesh), tx)
    step = make_policy_step(graphdef, tx, ALGO, temperature=0.8)
    layout = [x.sharding for x in jax.tree.leaves(state)]
    micro = to_micro_batches(_batch(), jnp.arange(B), 4)
    for _ in range(2):
        state, _ = step(state, micro)
        assert [x.sharding for x in jax.tree.leaves(state)] == layout
    assert step.cache_size() == 1


@pytest.mark.slow  # 33 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("micro", [1, 2, 8])
def test_policy_step_invariant_to_micro_batch_split(micro):
    model = init_model(CFG, seed=2)
    batch = _batch(1)
    s_full, m_full = _run_policy(model, batch, B)
    s_split, m_split = _run_policy(model, batch, micro)
    # trusted: the whole batch at once; exact: the same in float64
    keys = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm")
    exact = _exact_policy(model, batch, B)
    _assert_as_accurate((s_split, m_split), (s_full, m_full), exact, keys)


@pytest.mark.slow  # 14 s in a loaded 2-worker run, AMD EPYC AVX2
def test_nan_batch_is_skipped_not_applied():
    model = init_model(CFG, seed=3)
    batch = _batch(2)
    b, t = np.argwhere(np.asarray(batch.loss_mask) > 0)[0]  # a trained token
    bad = dataclasses.replace(batch, advantages=batch.advantages.at[b, t].set(jnp.nan))
    before = [np.asarray(x) for x in jax.tree.leaves(nnx.split(model)[1])]
    state, metrics = _run_policy(model, bad, 4)
    assert float(metrics["actor/skipped"]) == 1.0
    assert int(state.step) == 0
    for a, b in zip(before, jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(b), a)
    state, metrics = _run_policy(model, batch, 4)
    assert float(metrics["actor/skipped"]) == 0.0 and int(state.step) == 1


def test_a_skipped_update_reports_what_it_applied():
    """`update_norm` is the norm of the update applied: 0 when skipped, though AdamW's weight
    decay alone would move the params."""
    from jaxrl_llm.learner.state import TrainState, apply_gradients

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))
    state = TrainState.create({"w": jnp.ones(3)}, tx, jax.random.PRNGKey(0))
    state, _ = apply_gradients(state, {"w": jnp.array([0.5, -2.0, 1.0])}, tx)  # moments != 0
    bad = [({"w": jnp.array([1.0, jnp.nan, 0.0])}, None),
           ({"w": jnp.array([1.0, jnp.inf, 0.0])}, None),  # the clip's scale: 1/inf * inf
           ({"w": jnp.array([1.0, 2.0, 0.0])}, jnp.float32(jnp.nan))]  # fmt: skip
    for grads, loss in bad:  # the whole state, moments and step too, is left as it was
        skipped, m = apply_gradients(state, grads, tx, loss)
        assert float(m["skipped"]) == 1.0 and float(m["update_norm"]) == 0.0
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(skipped), strict=True):
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    new, m = apply_gradients(state, {"w": jnp.array([1.0, 2.0, 0.0])}, tx)
    moved = float(jnp.linalg.norm(new.params["w"] - state.params["w"]))  # the subtraction is
    # exact (Sterbenz: the params stay within a factor 2), but params + update rounded each
    # coordinate once, half an ulp of the new params: |u| ~ 1e-2 against |p| ~ 1 makes that
    # up to 8e-6 of the norm; then each norm's squares, sum of 3 and sqrt (2.5 u, twice).
    tol = FLOAT32_EPS / 2 * np.linalg.norm(np.asarray(new.params["w"], np.float64))
    tol += 3 * FLOAT32_EPS * moved
    assert float(m["skipped"]) == 0.0 and abs(float(m["update_norm"]) - moved) <= tol


@pytest.mark.slow  # 18 s in a loaded 2-worker run, AMD EPYC AVX2
def test_critic_step_reduces_value_loss():
    critic = init_model(CFG, seed=4, cls=ValueModel)
    tx = optax.adam(1e-2)
    graphdef, params = nnx.split(critic)
    state = TrainState.create(params, tx, jax.random.PRNGKey(0))
    step = make_critic_step(graphdef, tx, AlgoConfig(value_clip=None))
    batch = _batch(3)
    batch = dataclasses.replace(batch, returns=0.5 + batch.returns)  # learnable targets
    mb = to_micro_batches(batch, jnp.arange(B), 4)
    losses = []
    for _ in range(20):
        state, m = step(state, mb)
        losses.append(float(m["critic/vf_loss"]))
    assert losses[-1] < 0.2 * losses[0], losses


def _full_logits_logprobs(model, input_ids, mask, *, temperature, entropy="off", packing=None):
    """The pre-#15 policy forward: float32 logits and entropy on every position."""
    assert packing is None
    logits = model(input_ids[:, :-1])
    lp = shift_right(alg.token_logprobs(logits, input_ids[:, 1:], temperature=temperature))
    ent = shift_right(alg.entropy(logits, temperature=temperature))
    return lp, None if entropy == "off" else ent


@pytest.mark.slow  # 37 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01], ids=["entropy-metric", "entropy-loss"])
def test_policy_step_equals_the_full_logits_loss(monkeypatch, entropy_coef):
    """Logits only on trained positions, chunked, change nothing: the same parameters after
    the step, losses and metrics as logits and entropy over every position."""
    model = init_model(CFG, seed=5)
    batch = _batch(4)
    algo = dataclasses.replace(ALGO, entropy_coef=entropy_coef)
    got = _run_policy(model, batch, 4, algo)
    monkeypatch.setattr(steps, "policy_logprobs", _full_logits_logprobs)
    want = _run_policy(model, batch, 4, algo)
    # trusted: the full-logits forward; exact: the same in float64
    _assert_as_accurate(got, want, _exact_policy(model, batch, 4, algo))


def test_on_policy_shortcut_is_off_where_the_old_logprobs_are_needed():
    """The experience pass's old logprobs are needed by a KL in the reward and by trained
    tool output (they fill its missing rollout logprobs), so neither takes the shortcut."""
    assert steps.exactly_on_policy(AlgoConfig(mini_batches=1))
    assert not steps.exactly_on_policy(AlgoConfig(mini_batches=1, kl_in_reward_coef=0.1))
    assert not steps.exactly_on_policy(AlgoConfig(mini_batches=1, mask_tool_output=False))
    assert not steps.exactly_on_policy(AlgoConfig(mini_batches=2))


@pytest.mark.slow  # 33 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("policy_loss", ["ppo", "gspo"])
def test_on_policy_shortcut_equals_the_full_path(policy_loss):
    """One epoch of one mini-batch: the step's own logprobs (stop_gradient) as the old ones
    give the update of the full path, whose old logprobs come from the experience pass;
    `batch.old_logprobs` is not read (NaN here). The rollout mismatch metrics come from the
    step and equal those of the experience pass over the trained tokens."""
    model = init_model(CFG, seed=6)
    batch = _batch(5)
    algo = dataclasses.replace(ALGO, policy_loss=policy_loss)

    def full_path(model, batch):
        """The update whose old logprobs come from the experience pass, and its metrics."""
        graphdef, params = nnx.split(model)
        experience = make_experience_fn(graphdef, None, algo, temperature=0.8, group_size=2,
                                        micro_batch=4)  # fmt: skip
        full_batch, _, exp_metrics = experience(
            params, None, None, batch.input_ids, batch.loss_mask, batch.loss_mask,
            jnp.zeros(B, batch.loss_mask.dtype), batch.rollout_logprobs,
        )  # fmt: skip
        full = dataclasses.replace(batch, old_logprobs=full_batch.old_logprobs)
        return _run_policy(model, full, 4, algo), exp_metrics

    want, exp_metrics = full_path(model, batch)
    blind = dataclasses.replace(batch, old_logprobs=jnp.full((B, T), jnp.nan))
    got = _run_policy(model, blind, 4, algo, on_policy=True)
    with jax.enable_x64(True):  # exact: the full path in float64
        (s64, m64), exp64 = full_path(float64_twin(model), as_float64(batch))
        exact = jax.device_get((s64.params, m64))
        exp64 = jax.device_get(exp64)
    _assert_as_accurate(got, want, exact)
    diffs = ("rollout/logprob_diff/mean", "rollout/logprob_diff/max")
    assert not set(diffs) & set(want[1])
    # trusted: the experience pass's metrics; exact: the same in float64
    pick = lambda m: {k: m[k] for k in diffs}
    worst = assert_as_accurate(pick(got[1]), pick(exp_metrics), pick(exp64))
    print(f"logprob_diff error / bound: {worst:.2f}")


def test_micro_batches_are_cut_on_the_mesh():
    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    batch = _batch(6)
    rows = jnp.asarray([5, 0, 7, 2], jnp.int32)
    got = make_micro_batch_fn(mesh, 2)(batch, rows)
    want = to_micro_batches(batch, np.asarray(rows), 2)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.is_equivalent_to(batch_sharding(mesh, a.shape, axis=1), a.ndim)


@pytest.mark.slow  # measured: 15 s for both alone on 2 cores (AMD EPYC, 2026-12-04)
@pytest.mark.parametrize("flat_rows", [True, False], ids=["merged-rows", "two-row-dims"])
def test_the_backward_copies_no_activation_gradient_transposed(monkeypatch, flat_rows):
    """The compiled policy step forms the MLP's weight gradients without writing a
    transposed [F, B, T] copy of an activation gradient. With the projections contracting
    over two row dims ([B, T, in] x [in, out]) XLA:CPU made two such copies per MLP and step
    (one fused with the SwiGLU backward: about 1 s of a 0.5B-shape step on an AMD EPYC,
    docs/performance.md); `lora.dense` merges the rows. (q_proj's gradient, fused with the
    rotary backward, is still written [N * H, rows].) The unmerged form is checked too, so
    the test is known to see such copies."""
    import math
    import re

    from jaxrl_llm.models import ModelConfig, lora

    if not flat_rows:
        monkeypatch.setattr(lora, "_flat_rows", lambda spec, x: (spec, x, ()))
    cfg = ModelConfig(vocab_size=160, hidden_size=96, intermediate_size=224, num_heads=6,
                      num_kv_heads=2, head_dim=16, num_layers=1)  # fmt: skip
    rows, t = 2, 11
    rng = np.random.default_rng(0)
    ids = rng.integers(3, cfg.vocab_size, (1, rows, t)).astype(np.int32)
    ones = jnp.ones((1, rows, t), jnp.float32)
    batch = TrainBatch(input_ids=jnp.asarray(ids), loss_mask=ones, old_logprobs=-3 * ones,
                       ref_logprobs=-3 * ones, advantages=ones, returns=ones,
                       old_values=0 * ones, rollout_logprobs=-3 * ones)  # fmt: skip
    tx = optax.sgd(0.1)
    graphdef, state = _policy_state(init_model(cfg, seed=0), tx)
    step = make_policy_step(graphdef, tx, AlgoConfig(), temperature=1.0)
    hlo = step.lower(state, batch).compile().as_text()
    outs = {cfg.intermediate_size}  # F: no other dim of the model is 224
    made, op = [], r"^\s*(?:ROOT )?%((?:copy|transpose)[\w.\-]*) = \w+\[([\d,]+)\]"
    for m in re.finditer(op, hlo, re.M):
        dims = [int(d) for d in m.group(2).split(",")]
        if dims[0] in outs and math.prod(dims[1:]) == rows * (t - 1):  # positions forwarded
            made.append(f"{m.group(1)} {dims}")
    assert bool(made) != flat_rows, made


@pytest.mark.slow  # measured: 6.8 s (fast tier, AMD EPYC, 2026-12-06)
def test_importance_weight_metrics_are_over_the_mini_batch_tokens():
    """`is/weight/max` is the max over the mini-batch's trained tokens and `is/weight/mean`,
    `is/clipped_frac` their means, however the micro-batches split them: not a mean of
    per-micro-batch values, which a micro-batch without a trained token pulls toward 0.

    Measured against `importance_weights` over the whole mini-batch in float64, within the
    step's own float32 error: each weight's (the log ratio's subtraction, exp's rounding:
    `tests/algorithms/test_off_policy.py`), and for the means the reduction's roundings,
    at most n_max - 1 in a micro-batch's sum, its division and the product with its token
    count, M - 1 in the sum over micro-batches, and the final division. A 0/1 count is
    exact (integers), so the clipped fraction has only the last M + 2 roundings."""
    batch = _batch(2)
    mask = np.asarray(batch.loss_mask).copy()
    mask[6:] = 0  # the last micro-batch of 2 rows trains no token
    roll = np.asarray(batch.old_logprobs).copy()
    row, col = 0, int(np.flatnonzero(mask[0])[0])
    roll[row, col] -= np.log(2.5)  # one weight above the cap, in the first micro-batch
    batch = dataclasses.replace(batch, loss_mask=jnp.asarray(mask),
                                rollout_logprobs=jnp.asarray(roll))  # fmt: skip
    _, got = _run_policy(init_model(CFG, seed=2), batch, 2)
    inputs = (batch.old_logprobs, batch.rollout_logprobs, batch.loss_mask)
    with jax.enable_x64(True):  # exact: the whole mini-batch's metrics in float64
        exact = jax.device_get(alg.importance_weights(*as_float64(inputs), cap=2.0)[1])
    on = mask > 0
    log_r = np.asarray(batch.old_logprobs, np.float64)[on] - roll[on].astype(np.float64)
    w = np.exp(log_r)  # the raw weights of the trained tokens, exact
    e_w = w * FLOAT32_EPS * (np.abs(log_r) + 2)  # one subtraction, then exp (2 eps)
    assert np.all(np.abs(w - 2.0) > e_w)  # float32 clips the tokens float64 clips
    n, m = len(w), B // 2  # trained tokens, micro-batches
    n_max = int(mask.reshape(m, -1).sum(1).max())
    clipped = (w > 2.0).astype(np.float64)
    tols = {
        "is/weight/max": e_w.max(),
        "is/weight/mean": (e_w.sum() + float32_sum_tolerance(w, roundings=n_max + m)) / n
        + FLOAT32_EPS * w.mean(),
        "is/clipped_frac": (m + 2) * FLOAT32_EPS * clipped.mean(),
    }
    for k, tol in tols.items():
        err = abs(float(got[k]) - float(exact[k]))
        print(f"{k}: |float32 step - float64| = {err:.3g}, bound {tol:.3g}")
        assert err <= tol, (k, float(got[k]), float(exact[k]), tol)
    assert float(got["is/weight/max"]) > 2.0  # the raw weight, before truncation


def test_fetch_takes_the_max_and_min_over_updates():
    """A step's `.../max` metric is the largest of its updates', a `.../min` the smallest,
    the others their mean."""
    from jaxrl_llm.learner.learn import DeviceMetrics, fetch

    device = DeviceMetrics()
    for x in ((1.75, -2.0, 1.0), (1.25, -3.0, 0.5)):
        v = [jnp.asarray(a, jnp.float32) for a in x]
        device.add({"is/weight/max": v[0], "critic/advantages/min": v[1], "is/weight/mean": v[2]})
    got = fetch(device)
    assert got == {"is/weight/max": 1.75, "critic/advantages/min": -3.0, "is/weight/mean": 0.75}


def _budget_rows(prompt_budget: int, response_budget: int, seed=7):
    """The same samples (prompt, response, advantages, returns) in rows of `prompt_budget +
    response_budget` tokens: prompt, then response, then padding."""
    rng = np.random.default_rng(seed)
    prompts, responses = rng.integers(1, 4, B), rng.integers(1, response_budget + 1, B)
    t = prompt_budget + response_budget
    ids = np.zeros((B, t), np.int32)
    mask, adv, ret = (np.zeros((B, t), np.float32) for _ in range(3))
    tokens = rng.integers(3, CFG.vocab_size, (B, 3 + response_budget))  # prompts <= 3
    a, r = rng.normal(size=(B, response_budget)), rng.normal(size=(B, response_budget))
    for b in range(B):
        p, n = prompts[b], responses[b]
        ids[b, : p + n] = tokens[b, : p + n]
        mask[b, p : p + n] = 1
        adv[b, p : p + n], ret[b, p : p + n] = a[b, :n], r[b, :n]
    z = np.zeros((B, t), np.float32)
    batch = TrainBatch(
        input_ids=jnp.asarray(ids), loss_mask=jnp.asarray(mask), old_logprobs=jnp.asarray(z),
        ref_logprobs=jnp.asarray(z), advantages=jnp.asarray(adv), returns=jnp.asarray(ret),
        old_values=jnp.asarray(z), rollout_logprobs=jnp.asarray(z),
    )  # fmt: skip
    return batch


@pytest.mark.slow  # four small steps (two budgets, policy and critic)
def test_dr_grpo_divides_by_the_response_budget_not_the_row_length(monkeypatch):
    """`seq-mean-token-sum-norm` (Dr.GRPO): the policy loss is sum_b s_b / (S * R), R the
    response budget (`RolloutConfig.max_new_tokens`), not the row length (prompt budget +
    R): the same samples in rows for two prompt budgets give the same loss. On-policy, the
    ratio is exactly 1, so each token's loss is -A_t; the critic's values are fixed (the
    critic's loss is then 0.5 (v - R)^2 per token), so both losses are exact in float64.
    Tolerance: one float32 program's sum of the weighted terms (`aggregation_weights` x
    loss), in any order (`float32_sum_tolerance`, halved: one program against the exact
    value), plus the scale and normaliser divisions and the micro-batch sum."""
    response_budget, micro = 5, 4
    algo = AlgoConfig(loss_agg="seq-mean-token-sum-norm", value_clip=None)
    fixed = lambda ids: (ids % 7).astype(jnp.float32) * 0.25  # the critic's "values"
    monkeypatch.setattr(steps, "sequence_values", lambda critic, ids, packing=None: fixed(ids))
    tx = optax.sgd(0.1)
    losses = []
    for prompt_budget in (3, 9):
        batch = _budget_rows(prompt_budget, response_budget)
        mask = np.asarray(batch.loss_mask, np.float64)
        alg_weights = aggregation_weights(  # 1 / (S R) on each trained token
            mask, "seq-mean-token-sum-norm", scale_factor=response_budget
        )
        per_token = {
            "actor/pg_loss": -np.asarray(batch.advantages, np.float64),
            "critic/vf_loss": 0.5
            * (np.asarray(fixed(batch.input_ids), np.float64) - np.asarray(batch.returns)) ** 2,
        }
        mb = to_micro_batches(batch, jnp.arange(B), micro)
        graphdef, state = _policy_state(init_model(CFG, seed=8), tx)
        step = make_policy_step(
            graphdef, tx, algo, temperature=1.0, on_policy=True, response_budget=response_budget
        )
        _, got = step(state, mb)
        graphdef, state = _policy_state(init_model(CFG, seed=8, cls=ValueModel), tx)
        _, critic = make_critic_step(graphdef, tx, algo, response_budget=response_budget)(state, mb)
        got.update(critic)
        for key, loss in per_token.items():
            terms = alg_weights * loss
            want = terms.sum()
            n = int(mask.sum())
            tol = float32_sum_tolerance(terms.ravel(), roundings=n + B // micro) / 2
            tol += 2 * FLOAT32_EPS * abs(want)
            err = abs(float(got[key]) - want)
            print(f"P={prompt_budget} {key}: {float(got[key]):.7g} vs {want:.7g}, bound {tol:.3g}")
            assert err <= tol, (prompt_budget, key, float(got[key]), want, tol)
            if key == "actor/pg_loss":
                losses.append((float(got[key]), tol))
    (l3, tol3), (l9, tol9) = losses  # the same samples: the same loss for both budgets
    assert abs(l3 - l9) <= tol3 + tol9


def test_dr_grpo_needs_the_response_budget():
    graphdef, _ = nnx.split(init_model(CFG, seed=8))
    algo = AlgoConfig(loss_agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="response_budget"):
        make_policy_step(graphdef, optax.sgd(0.1), algo, temperature=1.0)
    with pytest.raises(ValueError, match="response_budget"):
        make_critic_step(graphdef, optax.sgd(0.1), algo)

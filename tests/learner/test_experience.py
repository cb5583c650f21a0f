"""The experience pass (one jitted program) equals separate full-logits forwards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrl_llm.algorithms as alg
from jaxrl_llm.learner.experience import advantage_fn, make_experience_fn, shift_right
from jaxrl_llm.learner.rl_config import AlgoConfig
from jaxrl_llm.testing import (
    FLOAT32_EPS,
    as_float64,
    assert_as_accurate,
    float32_sum_tolerance,
    float64_twin,
    tiny_config,
)
from tests.algorithms.test_advantages import whiten_tolerance

from .rl_helpers import random_rows

CFG = tiny_config()
B, T, G, TEMP = 8, 12, 2, 0.7
# GAE with a KL penalty in the reward: advantages read old, reference logprobs and values.
ALGO = AlgoConfig(estimator="gae", kl_in_reward_coef=0.05, kl_in_reward_kind="k3")


def _rows(seed=0):
    rng = np.random.default_rng(seed)
    ids, response = random_rows(rng, B, T, CFG.vocab_size)
    row = next(b for b in range(B) if response[b].sum() >= 3)
    response[row, np.flatnonzero(response[row])[1]] = 0  # tool output inside a response
    keep = np.ones(B, np.float32)
    keep[3] = 0  # a truncated sample under the overlong filter
    scores = rng.integers(0, 2, B).astype(np.float32)
    rollout = (rng.normal(size=(B, T)) * 0.1 - 3.0).astype(np.float32) * response
    return tuple(map(jnp.asarray, (ids, response, keep, scores, rollout)))


def _full_logprobs(model, ids):
    """The pre-#15 forward: float32 logits on every position, then the log-softmax."""
    logits = model(ids[:, :-1])
    return shift_right(alg.token_logprobs(logits, ids[:, 1:], temperature=TEMP))


def _exact_logprobs(model, ids):
    """`_full_logprobs` in float64 (`testing.float64_twin`): the exact value that the pass's
    forwards and the separate ones are measured against (`testing.assert_as_accurate`)."""
    with jax.enable_x64(True):
        return np.asarray(_full_logprobs(float64_twin(model), as_float64(ids)))


def _advantages_f64(algo, scores, loss, old, ref, values):
    """`advantage_fn` in float64 on the given float32 inputs: the exact result, to rounding."""
    with jax.enable_x64(True):
        f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))
        out = advantage_fn(algo, G)(*map(f64, (scores, loss, old, ref, values)))
        return tuple(np.asarray(x) for x in out)


def _advantage_tolerances(algo, loss, old, ref, values, adv, returns, rewards):
    """Bounds on |float32 - exact| summed over two programs for (advantages, returns, sequence
    rewards), from the float64 results: the shaped reward as the sum of its terms, each GAE
    step as a sum of r, gamma V', V, gamma lam A' plus the carried error, then the whitening."""
    old, ref, values, loss = (np.asarray(x, np.float64) for x in (old, ref, values, loss))
    k, gamma, lam = algo.kl_in_reward_coef, algo.gamma, algo.lam
    kl_terms = [k * np.exp(ref - old), k * ref, k * old, np.full_like(old, k)]
    e_r = float32_sum_tolerance([rewards, *kl_terms], roundings=8) * loss  # k3: exp, 2 subs
    raw = np.where(loss > 0, returns - values, 0.0)  # A before whitening
    e_raw = np.zeros_like(raw)
    carried, next_v, last = (np.zeros(raw.shape[0]) for _ in range(3))
    for t in reversed(range(raw.shape[1])):  # gae_advantages' recursion
        terms = [rewards[:, t], gamma * next_v, values[:, t], gamma * lam * last]
        e_t = float32_sum_tolerance(terms, roundings=5) + e_r[:, t] + gamma * lam * carried
        keep = loss[:, t] > 0
        carried = np.where(keep, e_t, carried)
        next_v, last = np.where(keep, values[:, t], next_v), np.where(keep, raw[:, t], last)
        e_raw[:, t] = carried
    e_returns = (e_raw + float32_sum_tolerance([raw, values])) * loss
    e_adv = whiten_tolerance(raw, e_raw, loss, adv)  # then the whitening
    e_seq = float32_sum_tolerance(rewards, axis=-1) + e_r.sum(-1)
    return e_adv, e_returns, e_seq


def _assert_grpo_advantages(adv, scores, loss):
    """GRPO's advantages of integer ``scores`` (groups of G) on the ``loss`` tokens, against
    the float64 run: the mean and the centred scores are exact in float32, the rest rounds
    at most 6 times, within 4 eps32 of |A| (the derivation in
    `test_overlong_filter_leaves_truncated_samples_out_of_the_loss_only`)."""
    scores = np.asarray(scores, np.float64)
    assert np.all(scores == np.round(scores)), "the bound needs integer scores"
    with jax.enable_x64(True):
        want = np.asarray(alg.grpo_advantages(jnp.asarray(scores), G))[:, None]
    want = want * np.asarray(loss, np.float64)
    err = np.abs(np.asarray(adv, np.float64) - want)
    np.testing.assert_array_less(err, 4 * FLOAT32_EPS * np.abs(want) + 1e-30)


def _mean_tolerance(x, mask):
    """Two float32 programs' masked means of the same float32 `x`: the sum, then the divide."""
    x = np.asarray(x, np.float64)[np.asarray(mask) > 0]
    return float32_sum_tolerance(x) / x.size + FLOAT32_EPS * abs(x.mean())


def _reward_kl_penalty(batch, trained):
    """verl's `actor/reward_kl_penalty` of the pass's own logprobs in float64: k3 (ALGO's
    kind) per token, each sample's mean over its trained tokens, then the mean over samples;
    and the float32 program's bound: per token the rounding of d = ref - old, of expm1(d)
    (carried through its slope e^d) and of the difference, at two ulps each, then the two
    means' sums and divisions."""
    old, ref = (np.asarray(x, np.float64) for x in (batch.old_logprobs, batch.ref_logprobs))
    m = np.asarray(trained, np.float64)
    d = ref - old
    kl = np.expm1(d) - d
    e_tok = 2 * FLOAT32_EPS * (np.abs(d) * (1 + np.exp(d)) + np.abs(np.expm1(d)) + np.abs(kl))
    n = m.sum(-1)
    per = (kl * m).sum(-1) / n
    e_per = (float32_sum_tolerance(kl * m, axis=-1) + (e_tok * m).sum(-1)) / n
    e_per += FLOAT32_EPS * np.abs(per)
    e = (float32_sum_tolerance(per) + e_per.sum()) / per.size + FLOAT32_EPS * abs(per.mean())
    return per.mean(), float(e)


@pytest.mark.slow  # 33 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("old_logprobs", [True, False], ids=["full", "on-policy"])
def test_experience_pass_equals_separate_forwards(models, old_logprobs):
    policy, ref, critic = models
    graphdef, params = nnx.split(policy)
    critic_graphdef, critic_params = nnx.split(critic)
    ids, response, keep, scores, rollout = _rows()
    loss = response * keep[:, None]  # the overlong filter: out of the loss only
    algo = ALGO if old_logprobs else AlgoConfig(estimator="gae")  # no KL in the reward
    fn = make_experience_fn(
        graphdef, critic_graphdef, algo, temperature=TEMP, group_size=G, micro_batch=4,
        old_logprobs=old_logprobs,
    )  # fmt: skip
    args = (ids, response, response, scores, rollout)
    batch, seq_rewards, metrics = fn(params, nnx.split(ref)[1], critic_params, *args,
                                     sample_mask=keep)  # fmt: skip

    old, ref_lp = _full_logprobs(policy, ids), _full_logprobs(ref, ids)
    values = shift_right(critic(ids[:, :-1]))
    with jax.enable_x64(True):
        values64 = np.asarray(shift_right(float64_twin(critic)(as_float64(ids)[:, :-1])))
    exact = [_exact_logprobs(policy, ids), _exact_logprobs(ref, ids), values64]
    if not old_logprobs:
        old = jnp.zeros_like(old)  # the on-policy shortcut leaves them out
        exact[0] = np.zeros_like(exact[0])
    # The forwards: one whole-model program against another (micro-batched, LM head on the
    # masked positions only; logprobs only on response positions), as accurate as the
    # separate forwards against the same in float64.
    r = np.asarray(response, np.float64)
    got = (batch.old_logprobs, batch.ref_logprobs, batch.old_values)
    trusted = (old * response, ref_lp * response, values)
    worst = assert_as_accurate(got, trusted, (exact[0] * r, exact[1] * r, exact[2]))
    print(f"forwards' error / bound: {worst:.2f}")
    for name, x in (("input_ids", ids), ("loss_mask", loss), ("rollout_logprobs", rollout)):
        np.testing.assert_array_equal(getattr(batch, name), x, err_msg=name)

    # Advantages, returns and rewards are `advantage_fn` of the forwards checked above, over
    # every trained token (the filtered sample's too): compare with it in float64 on the
    # pass's own forwards, within the float32 rounding of its sums. Returns cancel: V + A
    # with |V| up to ~13 gives |returns| ~ 1e-3, so no fixed atol fits.
    inputs = (batch.old_logprobs, batch.ref_logprobs, batch.old_values)
    adv, returns, token_rewards = _advantages_f64(algo, scores, response, *inputs)
    tols = _advantage_tolerances(algo, response, *inputs, adv, returns, token_rewards)
    got = (batch.advantages, batch.returns, seq_rewards)
    for name, g, want, tol in zip(("advantages", "returns", "rewards"), got,
                                  (adv, returns, token_rewards.sum(-1)), tols):  # fmt: skip
        assert tol.max() < 1e-4, name  # rounding, far below a bug's size
        np.testing.assert_array_less(np.abs(np.asarray(g, np.float64) - want), tol + 1e-30,
                                     err_msg=name)  # fmt: skip

    # Metrics: masked means (sums in another order) and maxima (exact) of the batch's arrays.
    # The mismatch over the model tokens of the samples trained on (the filtered one's out).
    trained = np.asarray(loss) > 0
    on_response = (np.asarray(response) > 0) & (np.asarray(keep)[:, None] > 0)
    a = np.asarray(batch.advantages)
    mean = lambda x, m, e=0.0: (np.asarray(x, np.float64)[m].mean(), _mean_tolerance(x, m) + e)
    want = {  # the rewards' mean may sum the token rewards in another order: their tolerance
        "critic/rewards/mean": mean(seq_rewards, np.ones(B, bool), tols[2].mean()),
        "critic/advantages/mean": mean(a, trained),
        "critic/advantages/max": (a[trained].max(), 0.0),
        "critic/advantages/min": (a[trained].min(), 0.0),
        "critic/values/mean": mean(batch.old_values, trained),
        "critic/returns/mean": mean(batch.returns, trained),
    }
    if old_logprobs:
        diff = np.abs(np.asarray(batch.old_logprobs) - np.asarray(rollout))
        want["rollout/logprob_diff/mean"] = mean(diff, on_response)
        want["rollout/logprob_diff/max"] = (diff[on_response].max(), 0.0)
        want["actor/reward_kl_penalty"] = _reward_kl_penalty(batch, response)
        c = ALGO.kl_in_reward_coef
        want["actor/reward_kl_penalty_coeff"] = (c, FLOAT32_EPS * c)  # as a float32
    assert set(metrics) == set(want)
    for k, (v, tol) in want.items():
        np.testing.assert_allclose(float(metrics[k]), v, rtol=0, atol=tol, err_msg=k)


def test_logprob_diff_reads_the_trained_samples_model_tokens(models):
    """`rollout/logprob_diff/*` over the model tokens of the samples trained on: an
    overlong-filtered sample is left out, as on the exactly-on-policy path (the policy step
    reads it over `loss_mask`), so the value does not change with the path
    `AlgoConfig.mini_batches` picks. The filtered sample's rollout logprobs are far off:
    counted, it would set the max (it did: 0.0115 against 0.0058 in a run)."""
    graphdef, params = nnx.split(models[0])
    ids, response, keep, scores, rollout = _rows()
    rollout = rollout.at[3].set(-50.0 * response[3])  # keep[3] == 0: filtered
    fn = make_experience_fn(graphdef, None, AlgoConfig(), temperature=TEMP, group_size=G,
                            micro_batch=B)  # fmt: skip
    batch, _, metrics = fn(params, None, None, ids, response, response, scores, rollout,
                           sample_mask=keep)  # fmt: skip
    trained = np.asarray(response * keep[:, None]) > 0
    diff = np.abs(np.asarray(batch.old_logprobs) - np.asarray(rollout))
    np.testing.assert_array_equal(metrics["rollout/logprob_diff/max"], diff[trained].max())
    got = float(metrics["rollout/logprob_diff/mean"])
    assert abs(got - diff[trained].mean()) <= _mean_tolerance(diff, trained), got


@pytest.mark.slow  # 9 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_experience_pass_without_reference_or_critic(models):
    """GRPO's pass: the policy forward only; reference logprobs and values are zeros."""
    policy = models[0]
    graphdef, params = nnx.split(policy)
    ids, response, _, scores, rollout = _rows(1)
    fn = make_experience_fn(
        graphdef, None, AlgoConfig(), temperature=TEMP, group_size=G, micro_batch=B
    )
    batch, _, metrics = fn(params, None, None, ids, response, response, scores, rollout)
    old = _full_logprobs(policy, ids)
    # trusted: the separate forward; exact: the same in float64
    exact = _exact_logprobs(policy, ids) * np.asarray(response, np.float64)
    assert_as_accurate(batch.old_logprobs, old * response, exact)
    assert not np.any(np.asarray(batch.ref_logprobs)) and not np.any(np.asarray(batch.old_values))
    _assert_grpo_advantages(batch.advantages, scores, response)
    assert "critic/values/mean" not in metrics


@pytest.mark.parametrize("estimator", ["grpo", "gae", "reinforce_plus_plus"])
def test_rewards_on_tokens_equal_outcome_scores_placed_there(estimator):
    """`advantage_fn` takes scores [B] (each on its row's last trained token) or rewards
    already on tokens [B, T]; the same placement gives the same advantages, and a reward on
    an untrained token is dropped. Per-turn rewards reach GAE as its token rewards."""
    _, loss, _, scores, _ = _rows()
    rng = np.random.default_rng(1)
    old, ref, values = (jnp.asarray(rng.normal(size=(B, T)), jnp.float32) for _ in range(3))
    algo = AlgoConfig(estimator=estimator, kl_in_reward_coef=0.05)
    fn = advantage_fn(algo, G)
    on_tokens = alg.outcome_token_rewards(scores, loss)
    outside = on_tokens + (1.0 - loss) * 7.0  # rewards on untrained tokens: ignored
    for got, want in zip(fn(outside, loss, old, ref, values), fn(scores, loss, old, ref, values)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    if estimator == "gae":
        turns = np.zeros((B, T), np.float32)
        turns[:, 2], turns[:, -1] = 0.5, 1.0
        turns = jnp.asarray(turns) * loss
        shaped = alg.kl_shaped_rewards(turns, old, ref, loss, kl_coef=0.05, kind="k1")
        adv, returns = alg.gae_advantages(shaped, values, loss, gamma=algo.gamma, lam=algo.lam)
        got = fn(turns, loss, old, ref, values)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(adv))
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(returns))


def test_overlong_filter_leaves_truncated_samples_out_of_the_loss_only(models):
    """DAPO's overlong filter: a truncated sample's score still counts in its group's
    baseline (GRPO's mean and std over all G scores); only the loss mask and the metrics of
    the trained tokens leave the sample out. Group [1, 1, 0, -1], the last truncated: the
    others' advantages are those of the whole group, not of [1, 1, 0, 0]."""
    graphdef, params = nnx.split(models[0])
    n, g = 4, 4
    ids, response, _, _, rollout = (x[:n] for x in _rows())
    scores = jnp.asarray([1.0, 1.0, 0.0, -1.0])
    keep = jnp.asarray([1.0, 1.0, 1.0, 0.0])
    fn = make_experience_fn(graphdef, None, AlgoConfig(), temperature=TEMP, group_size=g,
                            micro_batch=n)  # fmt: skip
    batch, seq_rewards, metrics = fn(params, None, None, ids, response, response, scores,
                                     rollout, sample_mask=keep)  # fmt: skip
    with jax.enable_x64(True):  # exact, to rounding: [0.783, 0.783, -0.261, -1.305]
        want = np.asarray(alg.grpo_advantages(jnp.asarray(np.asarray(scores, np.float64)), g))
    # The scores are small integers, so the mean and the centred scores are exact in float32;
    # the variance's divide, the sqrt, the + eps and the final divide round at most 6 times
    # (each reciprocal-and-multiply counted twice), u = eps32 / 2 each: within 3 eps32 of
    # |A| relative, bounded here by 4.
    tol = 4 * FLOAT32_EPS * np.abs(want)
    on = np.asarray(response) > 0
    adv = np.asarray(batch.advantages)
    for b in range(n):
        assert np.all(np.abs(adv[b, on[b]] - want[b]) <= tol[b]), (b, adv[b, on[b]], want[b])
    np.testing.assert_array_equal(batch.loss_mask, np.asarray(response * keep[:, None]))
    # Each score sits on one token, the others 0: the sequence sums are the scores exactly.
    np.testing.assert_array_equal(seq_rewards, scores)
    trained = np.asarray(batch.loss_mask) > 0
    mean = metrics["critic/advantages/mean"]
    assert abs(mean - adv[trained].mean()) <= _mean_tolerance(adv, trained), mean
    np.testing.assert_array_equal(metrics["critic/advantages/min"], adv[trained].min())


def test_kl_in_the_reward_needs_the_old_logprobs(models):
    graphdef = nnx.split(models[0])[0]
    with pytest.raises(ValueError, match="old logprobs"):
        make_experience_fn(graphdef, None, ALGO, temperature=TEMP, group_size=G, micro_batch=4,
                           old_logprobs=False)  # fmt: skip


@pytest.mark.slow  # 8 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_trained_tool_output_gets_logprobs_and_no_rollout_mismatch(models):
    """`mask_tool_output=False`: the loss mask covers the tool tokens too, so the pass gives
    them old logprobs (as on model tokens) and takes those as their rollout logprobs (none
    was sampled: a TIS weight of 1); the mismatch metric reads model tokens only."""
    policy = models[0]
    graphdef, params = nnx.split(policy)
    ids, response, _, scores, rollout = _rows(2)
    span = np.zeros((B, T), np.float32)  # every response token, the inserted one included
    for b, row in enumerate(np.asarray(response)):
        on = np.flatnonzero(row)
        span[b, on[0] : on[-1] + 1] = 1
    tool = span - np.asarray(response)
    assert tool.sum() == 1  # `_rows` inserts one tool token inside a response
    algo = AlgoConfig(mask_tool_output=False)
    fn = make_experience_fn(graphdef, None, algo, temperature=TEMP, group_size=G, micro_batch=B)
    batch, _, metrics = fn(params, None, None, ids, response, jnp.asarray(span), scores, rollout)

    old = np.asarray(_full_logprobs(policy, ids))
    # trusted: the separate forward; exact: the same in float64 (rollout logprobs: exact)
    exact = _exact_logprobs(policy, ids)
    got = (batch.old_logprobs, batch.rollout_logprobs)
    trusted = (old * span, np.where(tool > 0, old, np.asarray(rollout)))
    exact = (exact * span, np.where(tool > 0, exact, np.asarray(rollout, np.float64)))
    assert_as_accurate(got, trusted, exact)
    assert np.all(np.asarray(batch.old_logprobs)[tool > 0] < 0)  # computed there, not left 0
    np.testing.assert_array_equal(batch.loss_mask, span)
    _assert_grpo_advantages(batch.advantages, scores, span)
    # The mismatch metrics: trusted, the separate forward's; exact, the float64 forward's.
    on = np.asarray(response) > 0
    rollout64 = np.asarray(rollout, np.float64)
    diff, diff64 = (np.abs(x - rollout64)[on] for x in (old.astype(np.float64), exact[0]))
    names = ("rollout/logprob_diff/mean", "rollout/logprob_diff/max")
    assert_as_accurate(
        {k: metrics[k] for k in names},
        dict(zip(names, (diff.mean(), diff.max()), strict=True)),
        dict(zip(names, (diff64.mean(), diff64.max()), strict=True)),
    )


def test_trained_tool_output_needs_the_old_logprobs(models):
    graphdef = nnx.split(models[0])[0]
    with pytest.raises(ValueError, match="mask_tool_output=False"):
        make_experience_fn(graphdef, None, AlgoConfig(mask_tool_output=False), temperature=TEMP,
                           group_size=G, micro_batch=4, old_logprobs=False)  # fmt: skip

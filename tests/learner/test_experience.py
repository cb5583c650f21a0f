"""The experience pass (one jitted program) equals separate full-logits forwards."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrl_llm.algorithms as alg
from jaxrl_llm.learner.experience import advantage_fn, make_experience_fn, shift_right
from jaxrl_llm.learner.rl_config import AlgoConfig
from jaxrl_llm.testing import tiny_config

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
    loss = response.copy()
    loss[3] = 0  # a truncated sample under the overlong filter
    scores = rng.integers(0, 2, B).astype(np.float32)
    rollout = (rng.normal(size=(B, T)) * 0.1 - 3.0).astype(np.float32) * response
    return tuple(map(jnp.asarray, (ids, response, loss, scores, rollout)))


def _full_logprobs(model, ids):
    """The pre-#15 forward: float32 logits on every position, then the log-softmax."""
    logits = model(ids[:, :-1])
    return shift_right(alg.token_logprobs(logits, ids[:, 1:], temperature=TEMP))


@pytest.mark.parametrize("old_logprobs", [True, False], ids=["full", "on-policy"])
def test_experience_pass_equals_separate_forwards(models, old_logprobs):
    policy, ref, critic = models
    graphdef, params = nnx.split(policy)
    critic_graphdef, critic_params = nnx.split(critic)
    ids, response, loss, scores, rollout = _rows()
    algo = ALGO if old_logprobs else AlgoConfig(estimator="gae")  # no KL in the reward
    fn = make_experience_fn(
        graphdef, critic_graphdef, algo, temperature=TEMP, group_size=G, micro_batch=4,
        old_logprobs=old_logprobs,
    )  # fmt: skip
    args = (ids, response, loss, scores, rollout)
    batch, seq_rewards, metrics = fn(params, nnx.split(ref)[1], critic_params, *args)

    old, ref_lp = _full_logprobs(policy, ids), _full_logprobs(ref, ids)
    values = shift_right(critic(ids[:, :-1]))
    if not old_logprobs:
        old = jnp.zeros_like(old)  # the on-policy shortcut leaves them out
    adv, returns, token_rewards = advantage_fn(algo, G)(scores, loss, old, ref_lp, values)

    close = lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    close(batch.old_logprobs, old * response)  # logprobs only on response positions
    close(batch.ref_logprobs, ref_lp * response)
    close(batch.old_values, values)
    close(batch.advantages, adv)
    close(batch.returns, returns)
    close(seq_rewards, token_rewards.sum(-1))
    for name, x in (("input_ids", ids), ("loss_mask", loss), ("rollout_logprobs", rollout)):
        np.testing.assert_array_equal(getattr(batch, name), x, err_msg=name)

    trained = np.asarray(loss) > 0
    a = np.asarray(adv)[trained]
    want = {
        "critic/rewards/mean": float(np.asarray(token_rewards).sum(-1).mean()),
        "critic/advantages/mean": a.mean(),
        "critic/advantages/max": a.max(),
        "critic/advantages/min": a.min(),
        "critic/values/mean": np.asarray(values)[trained].mean(),
        "critic/returns/mean": np.asarray(returns)[trained].mean(),
    }
    if old_logprobs:
        diff = np.abs(np.asarray(old) - np.asarray(rollout))[np.asarray(response) > 0]
        want["rollout/logprob_diff/mean"] = diff.mean()
        want["rollout/logprob_diff/max"] = diff.max()
    assert set(metrics) == set(want)
    for k, v in want.items():
        np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_experience_pass_without_reference_or_critic(models):
    """GRPO's pass: the policy forward only; reference logprobs and values are zeros."""
    policy = models[0]
    graphdef, params = nnx.split(policy)
    ids, response, loss, scores, rollout = _rows(1)
    fn = make_experience_fn(
        graphdef, None, AlgoConfig(), temperature=TEMP, group_size=G, micro_batch=B
    )
    batch, _, metrics = fn(params, None, None, ids, response, loss, scores, rollout)
    old = _full_logprobs(policy, ids)
    np.testing.assert_allclose(batch.old_logprobs, old * response, rtol=1e-5, atol=1e-6)
    assert not np.any(np.asarray(batch.ref_logprobs)) and not np.any(np.asarray(batch.old_values))
    adv, _, _ = advantage_fn(AlgoConfig(), G)(scores, loss, old, old, None)
    np.testing.assert_allclose(batch.advantages, adv, rtol=1e-5, atol=1e-6)
    assert "critic/values/mean" not in metrics


def test_kl_in_the_reward_needs_the_old_logprobs(models):
    graphdef = nnx.split(models[0])[0]
    with pytest.raises(ValueError, match="old logprobs"):
        make_experience_fn(graphdef, None, ALGO, temperature=TEMP, group_size=G, micro_batch=4,
                           old_logprobs=False)  # fmt: skip


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
    close = lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    close(batch.old_logprobs, old * span)
    assert np.all(np.asarray(batch.old_logprobs)[tool > 0] < 0)  # computed there, not left 0
    np.testing.assert_array_equal(batch.loss_mask, span)
    close(batch.rollout_logprobs, np.where(tool > 0, old, np.asarray(rollout)))
    adv, _, _ = advantage_fn(algo, G)(scores, jnp.asarray(span), jnp.asarray(old), None, None)
    close(batch.advantages, adv)
    diff = np.abs(old - np.asarray(rollout))[np.asarray(response) > 0]
    close(float(metrics["rollout/logprob_diff/mean"]), diff.mean())
    close(float(metrics["rollout/logprob_diff/max"]), diff.max())


def test_trained_tool_output_needs_the_old_logprobs(models):
    graphdef = nnx.split(models[0])[0]
    with pytest.raises(ValueError, match="mask_tool_output=False"):
        make_experience_fn(graphdef, None, AlgoConfig(mask_tool_output=False), temperature=TEMP,
                           group_size=G, micro_batch=4, old_logprobs=False)  # fmt: skip

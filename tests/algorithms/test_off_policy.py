"""Off-policy importance weights against a float64 numpy loop written from the formulas
(token / sequence / geometric level, truncate / mask mode), and their wiring into the
policy step: the step's loss with a correction equals the step's without it on advantages
weighted by hand."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_llm.algorithms.off_policy import LOG_RATIO_CAP, importance_weights
from jaxrl_llm.learner.rl_config import AlgoConfig
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.learner.steps import make_policy_step, to_micro_batches
from jaxrl_llm.models import init_model
from jaxrl_llm.testing import FLOAT32_EPS, float32_sum_tolerance, tiny_config
from jaxrl_llm.types import TrainBatch

B, T = 4, 9


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 0.5, (B, T)).astype(np.float32)
    behaviour = (old + rng.normal(0.0, 0.4, (B, T))).astype(np.float32)
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    mask[1] = 0.0  # an empty row
    return old, behaviour, mask


def _reference(old, behaviour, mask, level, mode, cap, floor):
    """float64 weights from the formulas, the raw ones, and each raw weight's float32 error
    bound: the log ratio's (one rounding per subtraction; a sum's `float32_sum_tolerance`;
    a mean's division) times w, plus 2 eps for exp's own rounding (first order)."""
    out, raw, err = np.zeros((B, T)), np.zeros((B, T)), np.zeros((B, T))
    for b in range(B):
        on = mask[b] > 0
        if not on.any():  # an empty row: no weights (its zeros stand)
            continue
        logr = old[b][on].astype(np.float64) - behaviour[b][on].astype(np.float64)
        e_terms = FLOAT32_EPS * np.abs(logr)  # each subtraction, rounded once
        if level == "token":
            log_w, e_log = logr, e_terms
        else:
            total = logr.sum()
            e_total = e_terms.sum() + float32_sum_tolerance(logr)
            if level == "geometric":
                total, e_total = (
                    total / len(logr),
                    e_total / len(logr) + FLOAT32_EPS * abs(total / len(logr)),
                )
            log_w, e_log = np.full(len(logr), total), np.full(len(logr), e_total)
        w = np.exp(log_w)
        raw[b, on], err[b, on] = w, w * (e_log + 2 * FLOAT32_EPS)
        kept = w <= cap if mode == "truncate" else (w >= floor) & (w <= cap)
        out[b, on] = np.minimum(w, cap) if mode == "truncate" else np.where(kept, w, 0.0)
    return out, raw, err


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_weights_follow_the_formulas(level, mode):
    old, behaviour, mask = _inputs()
    cap, floor = (1.05, 0.97) if level == "geometric" else (1.3, 0.8)  # a mean varies less
    got, m = importance_weights(
        jnp.asarray(old), jnp.asarray(behaviour), jnp.asarray(mask),
        level=level, mode=mode, cap=cap, floor=floor,
    )  # fmt: skip
    want, raw, err = _reference(old, behaviour, mask, level, mode, cap, floor)
    on = mask > 0
    # No weight sits within its rounding of a bound, so float32 keeps or drops what float64 does.
    assert np.all(np.minimum(abs(raw - cap), abs(raw - floor))[on] > err[on])
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= err)
    kept = raw <= cap if mode == "truncate" else (raw >= floor) & (raw <= cap)
    n = on.sum()
    e_mean = err[on].sum() / n + float32_sum_tolerance(raw[on]) / n + FLOAT32_EPS * raw[on].mean()
    assert abs(float(m["is/weight/mean"]) - raw[on].mean()) <= e_mean
    top = np.argmax(np.where(on, raw, -np.inf))
    assert abs(float(m["is/weight/max"]) - raw.flat[top]) <= err.flat[top]
    # A count over a count: exact in float32 for these sizes, but for the final division.
    frac = 1 - kept[on].mean()
    assert abs(float(m["is/clipped_frac"]) - frac) <= FLOAT32_EPS * frac
    assert 0 < float(m["is/clipped_frac"]) < 1  # the bounds bite on these inputs, not always


def test_a_long_sequence_does_not_overflow_and_bad_options_are_refused():
    old = jnp.zeros((1, 64))
    behaviour = jnp.full((1, 64), -1.0)  # log ratio 64 over the sequence: exp would be 6e27
    w, m = importance_weights(old, behaviour, jnp.ones((1, 64)), level="sequence", cap=5.0)
    assert np.all(np.asarray(w) == 5.0)
    assert float(m["is/weight/max"]) == np.float32(np.exp(LOG_RATIO_CAP))
    w, _ = importance_weights(old, behaviour, jnp.ones((1, 64)), level="geometric", cap=5.0)
    np.testing.assert_allclose(np.asarray(w), np.e, rtol=1e-6)
    with pytest.raises(ValueError, match="level 'turn'"):
        importance_weights(old, behaviour, jnp.ones((1, 64)), level="turn")
    with pytest.raises(ValueError, match="mode 'clip'"):
        importance_weights(old, behaviour, jnp.ones((1, 64)), mode="clip")
    with pytest.raises(ValueError, match="floor <= cap"):
        importance_weights(old, behaviour, jnp.ones((1, 64)), cap=1.0, floor=2.0)
    with pytest.raises(ValueError, match=r"is_floor = 3\.0 is above is_cap"):
        AlgoConfig(is_cap=2.0, is_floor=3.0)


@pytest.mark.slow  # 70 s in a loaded 2-worker run, AMD EPYC AVX2 (the step's Jacobian)
@pytest.mark.parametrize(("level", "mode"), [("token", "truncate"), ("sequence", "mask")])
def test_the_policy_step_weights_the_advantages(level, mode):
    """One step with the correction equals one step without it whose advantages were
    multiplied by the weights beforehand (in mask mode, with the rejected tokens out of its
    loss mask too); the step reports the weights' metrics.

    The two programs differ only in the weights, each within its float32 error `err` of the
    exact ones (`_reference`), so the advantage-weight products differ by at most
    2 err |A|. The step is linear in those products (SGD; the PPO clip picks its branch by
    the ratio and the sign, which a positive weight keeps), so the tolerance is that
    difference through the step's Jacobian, plus the two programs' float32 orderings of
    the per-token sums (`float32_sum_tolerance`) and one rounding of the result."""
    cfg = tiny_config()
    rng = np.random.default_rng(3)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T)), jnp.int32)
    mask = jnp.asarray(np.concatenate([np.zeros((B, 3)), np.ones((B, T - 3))], 1), jnp.float32)
    model = init_model(cfg, seed=4)
    graphdef, params = nnx.split(model)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
    old = f(B, T) * 0.1 - 3.0
    batch = TrainBatch(
        input_ids=ids, loss_mask=mask, old_logprobs=old, ref_logprobs=old,
        advantages=f(B, T), returns=f(B, T), old_values=f(B, T),
        rollout_logprobs=old + f(B, T) * 0.3,
    )  # fmt: skip
    algo = AlgoConfig(is_cap=1.2, is_floor=0.9, is_level=level, is_mode=mode)
    w, _ = importance_weights(old, batch.rollout_logprobs, mask, level=level, mode=mode,
                              cap=1.2, floor=0.9)  # fmt: skip
    _, raw, err = _reference(
        np.asarray(old), np.asarray(batch.rollout_logprobs), np.asarray(mask), level, mode,
        1.2, 0.9,
    )  # fmt: skip
    on = np.asarray(mask) > 0
    assert np.all(np.minimum(abs(raw - 1.2), abs(raw - 0.9))[on] > err[on])  # same choices
    # In mask mode a rejected token also leaves the loss mask (and so the normaliser).
    kept = jnp.where(w > 0, mask, 0.0) if mode == "mask" else mask
    by_hand = dataclasses.replace(batch, advantages=batch.advantages * w, loss_mask=kept)
    tx = optax.sgd(0.1)

    def update(a, bt):
        state = TrainState.create(jax.tree.map(jnp.copy, params), tx, jax.random.PRNGKey(0))
        step = make_policy_step(graphdef, tx, a, temperature=1.0)
        return step(state, to_micro_batches(bt, jnp.arange(B), B))

    (s1, m1), (s2, m2) = update(algo, batch), update(AlgoConfig(), by_hand)
    p1, l1, p2, l2 = s1.params, m1["actor/pg_loss"], s2.params, m2["actor/pg_loss"]

    def weighted(v):
        state, m = update(AlgoConfig(), dataclasses.replace(by_hand, advantages=v))
        return state.params, m["actor/pg_loss"]

    # d(params, loss) / d(weighted advantages), one column per token: [..., B, T].
    jac = jax.jacfwd(weighted)
    jp, jl = jax.tree.map(np.asarray, jac(by_hand.advantages))
    # |products' difference| bound, on the tokens both steps train
    delta = 2 * err * np.abs(np.asarray(batch.advantages)) * np.asarray(kept)
    v = np.asarray(by_hand.advantages, np.float64)

    def tolerance(j, result):
        terms = (j * v).reshape(*j.shape[:-2], -1)  # each token's share of the result
        spread = np.tensordot(np.abs(j), delta, axes=2)
        return spread + float32_sum_tolerance(terms, axis=-1) + FLOAT32_EPS * np.abs(result)

    assert abs(float(l1) - float(l2)) <= tolerance(jl, float(l2))
    for x, y, j in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), jax.tree.leaves(jp), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert np.all(np.abs(x - y) <= tolerance(j, y))
    assert {"is/weight/mean", "is/weight/max", "is/clipped_frac"} <= set(m1)
    assert "is/weight/mean" not in m2

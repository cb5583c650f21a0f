"""`is_mode = "mask"` rejects as verl's rollout rejection sampling does: a token (or
sequence) whose importance weight lies outside [is_floor, is_cap] leaves the loss mask, so
it is out of the policy loss, its normaliser, the KL loss and the entropy term, the same for
any micro-batch split. `is/clipped_frac` reports the share of the trained tokens rejected."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_llm.learner import steps
from jaxrl_llm.learner.rl_config import AlgoConfig
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.learner.steps import make_policy_step, to_micro_batches
from jaxrl_llm.models import init_model
from jaxrl_llm.testing import FLOAT32_EPS, as_float64, assert_as_accurate, float64_twin, tiny_config
from jaxrl_llm.types import TrainBatch

from .rl_helpers import random_rows

CFG = tiny_config()
B, T = 8, 12
CAP, FLOOR = 2.0, 0.5


def _batch(level: str) -> tuple[TrainBatch, np.ndarray]:
    """A batch whose sampler logprobs equal the trainer's (weight exactly 1) but on the
    rejected tokens, and the mask of the trained tokens that stay. Token level: one token
    with weight e^3 > cap, one with e^-3 < floor; sequence level: one row with the summed
    log ratio >= 2 (weight >= e^2 > cap)."""
    rng = np.random.default_rng(11)
    ids, mask = random_rows(rng, B, T, CFG.vocab_size)
    f = lambda: rng.normal(size=(B, T)).astype(np.float32) * 0.1
    old = f() - 4.0
    roll = old.copy()
    kept = mask.copy()
    if level == "token":
        (b1, t1), (b2, t2) = np.argwhere(mask > 0)[[1, -3]]
        roll[b1, t1] -= 3.0  # w = e^3
        roll[b2, t2] += 3.0  # w = e^-3
        kept[b1, t1] = kept[b2, t2] = 0
    else:
        roll[2] -= 1.0 * mask[2]  # every token of row 2: log ratio 1 each, at least 2 tokens
        kept[2] = 0
    batch = TrainBatch(
        input_ids=jnp.asarray(ids), loss_mask=jnp.asarray(mask), old_logprobs=jnp.asarray(old),
        ref_logprobs=jnp.asarray(f() - 4.0), advantages=jnp.asarray(f() * 10),
        returns=jnp.asarray(f()), old_values=jnp.asarray(f()), rollout_logprobs=jnp.asarray(roll),
    )  # fmt: skip
    return batch, kept


def _run(model, batch, micro, algo):
    tx = optax.sgd(0.1)
    graphdef, params = nnx.split(model)
    state = TrainState.create(jax.tree.map(jnp.copy, params), tx, jax.random.PRNGKey(0))
    step = make_policy_step(graphdef, tx, algo, temperature=0.8)
    state, metrics = step(state, to_micro_batches(batch, jnp.arange(B), micro))
    return jax.device_get((state.params, metrics))


@pytest.mark.slow  # three small steps per level
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rejected_tokens_leave_the_loss_mask_for_any_split(level):
    """The mask-mode step with 4 micro-batches equals the step without correction over the
    whole mini-batch with the rejected tokens removed from its mask (the kept weights are
    exactly 1): parameters, policy loss, KL loss, entropy, gradient norm. Tolerance: that
    reference's own float32 error against float64 (`testing.assert_as_accurate`)."""
    model = init_model(CFG, seed=12)
    batch, kept = _batch(level)
    base = AlgoConfig(use_kl_loss=True, entropy_coef=0.01)
    algo = dataclasses.replace(base, is_cap=CAP, is_floor=FLOOR, is_level=level, is_mode="mask")
    got = _run(model, batch, 2, algo)
    removed = dataclasses.replace(batch, loss_mask=jnp.asarray(kept))
    trusted = _run(model, removed, B, base)
    with jax.enable_x64(True):  # exact: the reference in float64
        exact = _run(float64_twin(model), as_float64(removed), B, base)
    keys = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm")
    pick = lambda r: (r[0], {k: r[1][k] for k in keys})
    worst = assert_as_accurate(pick(got), pick(trusted), pick(exact))
    print(f"error / bound: {worst:.2f}")
    # The share of the trained tokens (before rejection) that were rejected: a count over a
    # count, each exact in float32; the micro-batch means are weighted back by their token
    # counts (M products, M - 1 sums, one division: M + 2 roundings at most).
    mask = np.asarray(batch.loss_mask)
    frac = 1 - kept.sum() / mask.sum()
    assert abs(float(got[1]["is/clipped_frac"]) - frac) <= (B // 2 + 2) * FLOAT32_EPS * frac


def test_mask_mode_reads_the_old_logprobs_before_the_update():
    """The rejection must be known before the mini-batch's normaliser, so it is computed
    from the experience pass's old logprobs: the on-policy shortcut is off in mask mode."""
    algo = AlgoConfig(mini_batches=1, is_cap=CAP, is_mode="mask")
    assert not steps.exactly_on_policy(algo)
    assert steps.exactly_on_policy(dataclasses.replace(algo, is_mode="truncate"))
    graphdef, _ = nnx.split(init_model(CFG, seed=12))
    with pytest.raises(ValueError, match="is_mode"):
        make_policy_step(graphdef, optax.sgd(0.1), algo, temperature=1.0, on_policy=True)

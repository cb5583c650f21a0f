"""Loss aggregation: hand values, padding invariance, micro-batch accumulation == full batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.algorithms as alg
from jaxrl_llm.algorithms import available, loss_normalizer

aggregate_loss = jax.jit(alg.aggregate_loss, static_argnames="mode")  # one compile per call site

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOSS = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
HAND = {
    "token-mean": (1 + 2 + 4) / 3,
    "seq-mean-token-sum": (3 + 4) / 2,
    "seq-mean-token-mean": (1.5 + 4) / 2,
    "seq-mean-token-sum-norm": (3 / 3 + 4 / 3) / 2,  # scale = T = 3
}


def test_all_modes_registered():
    assert set(MODES) == set(available("loss_agg"))


@pytest.mark.parametrize("mode", MODES)
def test_hand_values(mode):
    np.testing.assert_allclose(aggregate_loss(LOSS, MASK, mode), HAND[mode], rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_padding_rows_and_columns_change_nothing(mode):
    # a padding column holding NaN and a padding row holding garbage
    loss = jnp.array([[1.0, 2.0, 3.0, jnp.nan], [4.0, 5.0, 6.0, jnp.nan], [9.0, 9.0, 9.0, 9.0]])
    mask = jnp.zeros((3, 4)).at[:2, :3].set(MASK)
    got = aggregate_loss(loss, mask, mode, scale_factor=3.0)
    np.testing.assert_allclose(got, HAND[mode], rtol=1e-6)
    g = jax.grad(lambda x: aggregate_loss(x, mask, mode, scale_factor=3.0))(loss)
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(np.asarray(g)[np.asarray(mask) == 0], 0.0)


def test_empty_mask_gives_zero_not_nan():
    for mode in MODES:
        assert float(aggregate_loss(LOSS, jnp.zeros_like(MASK), mode)) == 0.0


def test_explicit_normalizer_and_bool_mask():
    np.testing.assert_allclose(
        aggregate_loss(LOSS, MASK.astype(bool), "token-mean", normalizer=7.0), 1.0, rtol=1e-6
    )
    np.testing.assert_allclose(loss_normalizer(MASK, "token-mean"), 3.0)
    np.testing.assert_allclose(loss_normalizer(MASK, "seq-mean-token-mean"), 2.0)


def test_unknown_mode_lists_choices():
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        aggregate_loss(LOSS, MASK, "token_mean")


def _per_token_loss(w, x):
    # a per-token loss with a non-trivial gradient: [B, T, D] @ [D] -> [B, T]
    return jnp.tanh(x @ w) ** 2 + x[..., 0] * w[0]


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_accumulation_equals_full_batch(mode):
    def loss_fn(w, x, m, normalizer=None):
        return aggregate_loss(_per_token_loss(w, x), m, mode, normalizer=normalizer)

    vg = jax.value_and_grad(loss_fn)

    @jax.jit  # one compile: the full batch and four micro-batches
    def full_and_accumulated(w, x, mask):
        norm = loss_normalizer(mask, mode)
        micro = [vg(w, xm, mm, norm) for xm, mm in zip(jnp.split(x, 4), jnp.split(mask, 4))]
        return vg(w, x, mask), jax.tree.map(lambda *a: sum(a), *micro)

    for seed in range(3):
        rng = np.random.default_rng(seed)
        x = jnp.asarray(rng.normal(size=(8, 5, 3)).astype(np.float32))
        w = jnp.asarray(rng.normal(size=3).astype(np.float32))
        mask = rng.random((8, 5)) < 0.6
        mask[seed] = False  # an empty sequence
        mask = jnp.asarray(mask.astype(np.float32))

        (full_loss, full_grad), (acc_loss, acc_grad) = full_and_accumulated(w, x, mask)
        np.testing.assert_allclose(acc_loss, full_loss, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(acc_grad, full_grad, rtol=1e-5, atol=1e-6)

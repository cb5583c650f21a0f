"""Loss aggregation: hand values, padding invariance, micro-batch accumulation == full batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.algorithms as alg
from jaxrl_llm.algorithms import available, loss_normalizer
from jaxrl_llm.testing import FLOAT32_EPS, aggregation_weights, float32_sum_tolerance

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


def _accumulation_tolerance(w, x, mask, mode):
    """Bounds on two float32 programs' disagreement on (loss, grad) = sum_t c_t (l_t, dl_t/dw),
    c the aggregation weights, t = tanh z, s = (1 + t)(1 - t), z = x . w. Per token: 6
    roundings of its value (t^2 + x0 w0; 2ts x_j + x_0), plus t's error (tanh within 2.2 ulp,
    5 u; z's 3 roundings of |x| . |w|) times |dl/dt| = 2|t| or |d(dl/dw_j)/dt| =
    2|1 - 3t^2||x_j|; then n - 1 roundings of the sum over tokens and 3 of c's divisions."""
    w, x = np.asarray(w, np.float64), np.asarray(x, np.float64)
    c = aggregation_weights(mask, mode)
    t = np.tanh(x @ w)
    s, e_t = 1 - t**2, 5 * np.abs(t) + 3 * (1 - t**2) * (np.abs(x) @ np.abs(w))  # units of u
    first = np.eye(3)[0] * x[..., :1]  # d(x0 w0)/dw
    values = (t**2 + x[..., 0] * w[0], 2 * (t * s)[..., None] * x + first)
    carried = (2 * np.abs(t) * e_t, 2 * (np.abs(1 - 3 * t**2) * e_t)[..., None] * np.abs(x))
    n = c.size
    return tuple(
        float32_sum_tolerance((c.T * v.T).T.reshape(n, -1), roundings=n - 1 + 3 + 6)
        + FLOAT32_EPS * (c.T * e.T).T.reshape(n, -1).sum(0)
        for v, e in zip(values, carried)
    )


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

        full, acc = full_and_accumulated(w, x, mask)
        # Two float32 programs (summation orders): within their rounding bound of each other
        # and of the float64 value; the bound stays far below a bug's size (1e-3).
        with jax.enable_x64(True):
            f64 = lambda a: jnp.asarray(np.asarray(a, np.float64))
            exact = vg(*map(f64, (w, x, mask)))
        tols = _accumulation_tolerance(w, x, mask, mode)
        for name, a, b, e, tol in zip(("loss", "grad"), acc, full, exact, tols):
            assert np.max(tol) < 1e-4, name
            for got, want in ((a, b), (a, e), (b, e)):
                err = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
                np.testing.assert_array_less(err, tol, err_msg=name)

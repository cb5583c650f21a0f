"""The int8 promise of `models.quant` (each element of W_q * s within s / 2 of W, s being the
scale as stored) for float32 and bfloat16 weights, and on the rollout sampler's path
(`RolloutConfig.weights = 'int8'`, the trainer's float32 weights quantised at each push,
stored at `rollout_dtype`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import from_pretrained
from jaxrl_llm.models.quant import SCALE_SUFFIX, quantize_int8
from jaxrl_llm.rollout.jax_sampler import _make_cast

EPS32 = float(np.finfo(np.float32).eps)


def _assert_within_half_a_step(q, scale, w, name: str = "") -> None:
    """|q s - w| <= s / 2 + |w| eps32 for every element, in float64 (q s is exact there: an
    8-bit integer times a scale of at most 24 significant bits). The second term is the
    float32 rounding of w / s before it is rounded to an integer (at most a unit in the last
    place of w / s, i.e. |w| eps32 once multiplied back by s)."""
    q, w = np.asarray(q), np.asarray(jnp.asarray(w, jnp.float32), np.float64)
    s = np.asarray(jnp.asarray(scale, jnp.float32), np.float64)
    s = s[:, None] if name.endswith("embed_tokens") else s  # the embedding's scale: per row
    assert q.dtype == np.int8 and np.abs(q.astype(np.int32)).max() <= 127, name
    err = np.abs(q.astype(np.float64) * s - w)
    bound = s / 2 + np.abs(w) * EPS32
    assert (err <= bound).all(), (name, float((err / s).max()))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_quantize_int8_is_within_half_its_stored_scale(dtype):
    """Small columns too: float16 stores a scale under 6.1e-5 (a column's absmax under
    7.8e-3) to a fixed absolute step, which rounding may take far below absmax / 127."""
    w = jax.random.normal(jax.random.key(0), (64, 96), jnp.float32)
    for col, size in ((5, 1e-3), (6, 1e-4), (7, 4e-5), (8, 1e-5)):
        w = w.at[:, col].multiply(size)
    w = w.at[:, 3].set(0).astype(dtype)  # a zero column
    q, s = quantize_int8(w, 1)
    assert s.dtype == jnp.dtype(dtype) and s.shape == (96,)
    _assert_within_half_a_step(q, s, w)
    np.testing.assert_array_equal(np.asarray(q[:, 3]), 0)


@pytest.mark.parametrize("rollout_dtype", [None, "bfloat16"])
def test_the_int8_samplers_weights_are_within_half_their_stored_scale(rollout_dtype):
    """The sampler's cast quantises the trainer's float32 (master) weights: its stored pair
    (W_q, s at `rollout_dtype`) is within half a step of them."""
    policy = from_pretrained(builtin_checkpoint())
    master = {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(policy))}
    cast = _make_cast(rollout_dtype, int8=True)
    assert cast is not None
    synced = {"/".join(map(str, p)): v.get_value()
              for p, v in nnx.to_flat_state(jax.jit(cast)(nnx.state(policy)))}  # fmt: skip
    scales = [k for k in synced if k.endswith(SCALE_SUFFIX)]
    assert scales
    for key in scales:
        weight = key.removesuffix(SCALE_SUFFIX)
        assert synced[key].dtype == jnp.dtype(rollout_dtype or "float32"), key
        _assert_within_half_a_step(synced[weight], synced[key], master[weight], weight)

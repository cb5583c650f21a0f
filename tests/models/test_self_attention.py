"""Causal block attention skips the key blocks above the diagonal and changes nothing:
equal to dense `attend` in values and gradients, with padding and packed segments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models.layers import attend, causal_attend
from jaxrl_llm.models.transformer import full_mask


def _inputs(T, seed=0, B=2, N=4, K=2, H=8):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(ks[0], (B, T, N, H))
    k = jax.random.normal(ks[1], (B, T, K, H))
    v = jax.random.normal(ks[2], (B, T, K, H))
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, T), size=(B, 3), replace=False), axis=1)
    segments = np.stack([np.searchsorted(c, np.arange(T), side="right") + 1 for c in cuts])
    segments[:, -7:] = 0  # trailing padding
    return q, k, v, jnp.asarray(segments, jnp.int32)


@pytest.mark.parametrize("T,block", [(100, 32), (97, 32), (64, 64), (40, 64)])
def test_causal_blocks_equal_dense_attention_and_gradients(T, block):
    q, k, v, segments = _inputs(T)
    mask = full_mask(None, q.shape[0], T, segments)
    dense = lambda q, k, v: attend(q, k, v, mask, 0.3)
    blocked = lambda q, k, v: causal_attend(q, k, v, mask, 0.3, block=block)
    np.testing.assert_allclose(blocked(q, k, v), dense(q, k, v), rtol=1e-5, atol=1e-6)
    w = jax.random.normal(jax.random.PRNGKey(9), dense(q, k, v).shape)
    loss = lambda f: lambda *x: jnp.sum(f(*x) * w)
    got = jax.grad(loss(blocked), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(dense), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

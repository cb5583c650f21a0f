"""The int8 KV pool (`models.kv_int8.Int8Pages`): each token's heads quantised by its own
scale on write, and attention over the pool equal to attention over the float pool that
holds the dequantised values (as accurate, `testing.assert_as_accurate`), by every walk."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import paged
from jaxrl_llm.models.kv_int8 import Int8Pages, new_pool, quantize_kv, take_pages
from jaxrl_llm.models.paged import decode, decode_attention, gathered_attention, write_kv
from jaxrl_llm.testing import assert_as_accurate
from tests.models.test_paged import _dense_reference, _float64, _pool


def _quantised(kv):
    """(the int8 pool of float pool `kv`, the float pool of its dequantised values)."""
    q, scale = quantize_kv(kv)
    floats = np.asarray(q).astype(np.float32) * np.asarray(scale)[..., None]
    return Int8Pages(q, scale), jnp.asarray(floats)


def test_write_kv_quantises_each_token_and_head_by_its_own_scale():
    rng = np.random.RandomState(0)
    P, ps, K, H = 3, 4, 2, 8
    pool = new_pool((P, ps, 2 * K, H), jnp.int8)
    assert isinstance(pool, Int8Pages) and pool.shape == (P, ps, 2 * K, H)
    k = jnp.asarray(rng.randn(5, K, H).astype(np.float32) * 3)
    v = jnp.asarray(rng.randn(5, K, H).astype(np.float32) / 7)  # another magnitude
    slots = jnp.asarray([0, 5, 6, 11, P * ps])  # the last: one past the pool, dropped
    pool = write_kv(pool, k, v, slots)
    got = np.asarray(take_pages(pool, jnp.arange(P))).reshape(P * ps, 2 * K, H)
    want = np.stack([np.asarray(k), np.asarray(v)], axis=2).reshape(5, 2 * K, H)
    scale = np.abs(want).max(-1, keepdims=True) / 127  # per token and combined head
    for i, slot in enumerate([0, 5, 6, 11]):
        np.testing.assert_array_equal(
            np.asarray(pool.values).reshape(P * ps, 2 * K, H)[slot],
            np.clip(np.round(want[i] / scale[i]), -127, 127),
        )
        assert np.all(np.abs(got[slot] - want[i]) <= scale[i] / 2 * (1 + 1e-6))
    untouched = np.setdiff1d(np.arange(P * ps), [0, 5, 6, 11])
    assert (
        not got[untouched].any() and not np.asarray(pool.scales).reshape(-1, 2 * K)[untouched].any()
    )


@pytest.mark.slow  # 12 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@pytest.mark.parametrize("block_tokens", [8, 2048])  # blocks of 2 pages; one pass
def test_decode_over_int8_pages_is_decode_over_their_dequantised_values(block_tokens, monkeypatch):
    monkeypatch.setattr(paged, "BLOCK_TOKENS", block_tokens)
    rng = np.random.RandomState(4)
    B, N, K, H, ps, pps = 5, 4, 2, 8, 4, 5
    kv, table = _pool(rng, B, pps, ps, K, H)
    pool, floats = _quantised(kv)
    lens = jnp.asarray([1, ps, ps + 1, 0, pps * ps], jnp.int32)
    q = jnp.asarray(rng.randn(B, N, H).astype(np.float32))
    out = decode_attention(q, pool, lens, table, sm_scale=0.35)
    trusted = decode_attention(q, floats, lens, table, sm_scale=0.35)
    exact = _float64(_dense_reference, q, floats, lens, table, 0.35)
    assert_as_accurate(out, trusted, exact)
    on_gpu = decode(q, pool, lens, table, sm_scale=0.35, platform="gpu")  # whole rows
    assert_as_accurate(on_gpu, trusted, exact)


@pytest.mark.slow  # 8 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_gathered_attention_over_int8_pages():
    rng = np.random.RandomState(1)
    B, N, K, H, ps, pps, T = 3, 4, 2, 8, 4, 4, 3
    kv, table = _pool(rng, B, pps, ps, K, H)
    pool, floats = _quantised(kv)
    lens = jnp.asarray([5, 16, 3], jnp.int32)
    positions = lens[:, None] - T + jnp.arange(T)[None]
    q = jnp.asarray(rng.randn(B, T, N, H).astype(np.float32))
    out = gathered_attention(q, pool, lens, table, positions, sm_scale=0.5)
    trusted = gathered_attention(q, floats, lens, table, positions, sm_scale=0.5)
    for t in range(T):
        exact = _float64(_dense_reference, q[:, t], floats, positions[:, t] + 1, table, 0.5)
        assert_as_accurate(out[:, t], trusted[:, t], exact)

"""Paged attention (`models.paged`) against dense attention, and the paged `extend` against
the dense-cache `extend` and a full forward.

Float32 results are compared by `testing.assert_as_accurate`: the paged path must be as close
to the float64 run of the dense path as the dense float32 path is (issue #26: no fixed
tolerance, which XLA:CPU's per-host summation orders break)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import KVCache, ModelConfig, init_model, paged
from jaxrl_llm.models.layers import attend
from jaxrl_llm.models.paged import decode, decode_attention, gathered_attention, write_kv
from jaxrl_llm.testing import as_float64, assert_as_accurate, float64_twin, jitted

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8)  # fmt: skip


def _pool(rng, B, pps, ps, K, H, extra=7):
    """A pool with junk everywhere and a random (disjoint) page table per row."""
    P = B * pps + extra
    kv = rng.randn(P, ps, 2 * K, H).astype(np.float32) * 3
    table = rng.permutation(P)[: B * pps].reshape(B, pps).astype(np.int32)
    return jnp.asarray(kv), jnp.asarray(table)


def _float64(fn, *args):
    """`fn` on `args` with float arrays upcast to float64 (`testing.as_float64`), under x64:
    numpy out."""
    with jax.enable_x64(True):
        return np.asarray(fn(*as_float64(args)))


def _dense_reference(q, kv, lens, table, scale):
    B, pps = table.shape
    ps, C, H = kv.shape[1:]
    dense = kv[table].reshape(B, pps * ps, C, H)
    k, v = dense[:, :, 0::2], dense[:, :, 1::2]
    mask = jnp.arange(pps * ps)[None, None, :] < lens[:, None, None]
    out = attend(q[:, None], k, v, mask, scale)[:, 0]
    return jnp.where(lens[:, None, None] > 0, out, 0.0)


@pytest.mark.slow  # 15 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("block_tokens", [4, 24, 2048])
@pytest.mark.parametrize("ps", [4, 16])
def test_decode_attention_matches_dense(block_tokens, ps, monkeypatch):
    """The ragged walk in blocks of one page, of a few, and in one pass (a block larger
    than the tables: `block_pages` caps it)."""
    monkeypatch.setattr(paged, "BLOCK_TOKENS", block_tokens)
    rng = np.random.RandomState(ps + block_tokens)
    B, N, K, H, pps = 6, 4, 2, 8, 5
    kv, table = _pool(rng, B, pps, ps, K, H)
    lens = jnp.asarray([1, ps, ps + 1, 0, pps * ps, 3], jnp.int32)  # boundaries, idle row
    q = jnp.asarray(rng.randn(B, N, H).astype(np.float32))
    out = decode_attention(q, kv, lens, table, sm_scale=0.35)
    ref = _dense_reference(q, kv, lens, table, 0.35)
    exact = _float64(_dense_reference, q, kv, lens, table, 0.35)
    assert_as_accurate(out, ref, exact)  # trusted: dense float32; exact: dense float64


def test_blocks_of_the_walk_and_the_pages_they_read():
    """2,048 tokens a block, never more pages than the tables hold; the benchmarks'
    accounting counts every block the walk runs whole."""
    assert paged.block_pages(64, 32, 6) == 64  # 2,048 tokens of 32-token pages
    assert paged.block_pages(1, 32, 18) == 18  # one row of 18 pages: one pass of 18
    assert paged.block_pages(2, 4096, 1) == 1
    assert paged.pages_read(np.array([33, 0, 64]), 32, 6) == 18  # 4 in use; the 18 of 3 tables
    assert paged.pages_read(np.array([32 * 64 + 1]), 32, 80) == 128  # 65 pages: two blocks


@pytest.mark.slow  # 11 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_decode_per_platform_matches_dense(platform):
    """The GPU path (whole page table gathered) and the CPU walks agree with dense
    attention, idle rows included."""
    rng = np.random.RandomState(3)
    B, N, K, H, ps, pps = 5, 4, 2, 8, 4, 4
    kv, table = _pool(rng, B, pps, ps, K, H)
    lens = jnp.asarray([0, 1, 7, 16, 4], jnp.int32)
    q = jnp.asarray(rng.randn(B, N, H).astype(np.float32))
    out = decode(q, kv, lens, table, sm_scale=0.3, platform=platform)
    ref = _dense_reference(q, kv, lens, table, 0.3)
    exact = _float64(_dense_reference, q, kv, lens, table, 0.3)
    assert_as_accurate(out, ref, exact)  # trusted: dense float32; exact: dense float64


@pytest.mark.slow  # 10 s in a loaded 2-worker run, AMD EPYC AVX2
def test_gathered_attention_is_causal_over_the_row():
    rng = np.random.RandomState(1)
    B, N, K, H, ps, pps, T = 3, 4, 2, 8, 4, 4, 3
    kv, table = _pool(rng, B, pps, ps, K, H)
    lens = jnp.asarray([5, 16, 3], jnp.int32)
    positions = lens[:, None] - T + jnp.arange(T)[None]  # the last T tokens of each row
    q = jnp.asarray(rng.randn(B, T, N, H).astype(np.float32))
    out = gathered_attention(q, kv, lens, table, positions, sm_scale=0.5)
    for t in range(T):
        ref = _dense_reference(q[:, t], kv, positions[:, t] + 1, table, 0.5)
        exact = _float64(_dense_reference, q[:, t], kv, positions[:, t] + 1, table, 0.5)
        assert_as_accurate(out[:, t], ref, exact)  # trusted: dense float32; exact: float64


def test_write_kv_drops_out_of_range_slots():
    kv = jnp.zeros((3, 2, 4, 1))
    k = jnp.ones((2, 2, 1))
    out = write_kv(kv, k, 2 * k, jnp.asarray([1, 6]))  # slot 6 = one past the pool: dropped
    flat = np.asarray(out).reshape(6, 4)
    np.testing.assert_array_equal(flat[1], [1, 2, 1, 2])  # interleaved k0 v0 k1 v1
    assert np.count_nonzero(flat) == 4


@pytest.mark.slow  # 16 s in a 2-worker run, AMD EPYC AVX2, jitted (2026-12-05)
def test_extend_paged_equals_dense_extend():
    """Prefill-like append, then decode steps, at mixed starts: hidden states equal the
    dense cache's, and so do the keys/values read back from the pages (the first layer's
    bit for bit: both programs project the same embeddings at the same shapes; the last's
    as accurately)."""
    model = init_model(CFG, seed=0)
    with jax.enable_x64(True):
        twin = float64_twin(model)
    extend, extend_paged = jitted("extend"), jitted("extend_paged")  # eagerly: 431 compiles
    rng = np.random.RandomState(0)
    B, ps, pps, S = 3, 4, 6, 24
    P = B * pps + 2
    pools = tuple(jnp.zeros((P, ps, 2 * CFG.num_kv_heads, CFG.head_dim)) for _ in range(2))
    table = jnp.asarray(rng.permutation(P)[: B * pps].reshape(B, pps).astype(np.int32))
    cache = KVCache.zeros(CFG, B, S)
    lengths = jnp.asarray([5, 9, 1], jnp.int32)
    ids = jnp.asarray(rng.randint(0, 97, (B, 9)).astype(np.int32))
    start = jnp.zeros(B, jnp.int32)
    h_d, cache = extend(model, cache, ids, start, lengths)
    h_p, pools = extend_paged(model, pools, table, ids, start, lengths)
    with jax.enable_x64(True):
        h_x, cache_x = extend(twin, KVCache.zeros(twin.config, B, S), ids, start, lengths)
    rows = lambda h: [h[b, : int(lengths[b])] for b in range(B)]  # the written tokens
    assert_as_accurate(rows(h_p), rows(h_d), rows(h_x))  # trusted: dense cache; exact: float64
    held = lengths
    for _ in range(4):
        tok = jnp.asarray(rng.randint(0, 97, (B, 1)).astype(np.int32))
        one = jnp.ones(B, jnp.int32)
        h_d, cache = extend(model, cache, tok, held, one)
        h_p, pools = extend_paged(model, pools, table, tok, held, one)
        with jax.enable_x64(True):
            h_x, cache_x = extend(twin, cache_x, tok, held, one)
        assert_as_accurate(h_p, h_d, h_x)  # trusted: dense cache; exact: its float64 twin
        held = held + 1
    paged = [p[table].reshape(B, pps * ps, 2 * CFG.num_kv_heads, CFG.head_dim) for p in pools]
    for b in range(B):
        n = int(held[b])
        # layer 0: both programs write the same projection (same shapes) of the embeddings
        np.testing.assert_array_equal(paged[0][b, :n, 0::2], cache.k[0, b, :n])
        np.testing.assert_array_equal(paged[0][b, :n, 1::2], cache.v[0, b, :n])
        got = (paged[1][b, :n, 0::2], paged[1][b, :n, 1::2])
        want = (cache.k[1, b, :n], cache.v[1, b, :n])
        exact = (cache_x.k[1, b, :n], cache_x.v[1, b, :n])
        assert_as_accurate(got, want, exact)  # trusted: dense cache's; exact: float64 twin's


@pytest.mark.slow  # 13 s in a loaded 2-worker run, AMD EPYC AVX2
def test_inactive_rows_write_nothing():
    model = init_model(CFG, seed=0)
    pools = (jnp.zeros((4, 4, 4, 8)),) * 2
    table = jnp.asarray([[0, 1], [2, 3]], jnp.int32)
    ids = jnp.asarray([[3], [4]], jnp.int32)
    _, pools = model.extend_paged(pools, table, ids, jnp.asarray([0, 2]), jnp.asarray([1, 0]))
    assert np.count_nonzero(np.asarray(pools[0][2:])) == 0  # row 1 (inactive) untouched
    assert np.count_nonzero(np.asarray(pools[0][0, 0])) > 0
    assert jax.tree.leaves(pools)[0].shape == (4, 4, 4, 8)

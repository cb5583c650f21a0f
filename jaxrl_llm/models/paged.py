"""Paged KV cache: one page pool per layer, a page table per sequence, attention that reads
only the pages a sequence uses.

Layout (that of JAX's Pallas TPU kernel `ragged_paged_attention`, so the kernel can read it
directly): a layer's pool is `kv_pages [P, ps, 2K, H]`, combined head 2k holding key head k
and 2k + 1 value head k. Token t of a sequence lives in page `page_indices[t // ps]` at row
`t % ps`; its flat slot is `page * ps + t % ps`, and a flat slot >= P * ps means "do not
write" (padding, inactive rows). `kv_lens` counts a sequence's tokens in the cache, the
current query token included; 0 marks an inactive row (its output is zero). A row's unused
table entries may hold P (the engine's "no page"; a gather clamps it to page P - 1, another
sequence's) and the slots past its length keep what a page's previous occupant wrote: the
walks read such slots and may find inf or NaN there, so every walk (as the TPU kernel) selects
them out of the scores and the values alike, and they never reach an output.

`decode_attention` (one query per sequence) walks a ragged work list of (sequence, page)
pairs in blocks of `block_pages` pages with an online softmax, so a step reads the pages
in use and nothing else: its cost follows the tokens actually in context, not the slots x
maximum length. `gathered_attention` (several queries per sequence: a tool's output
appended to a live sequence) gathers each row's page table densely; it runs once per turn.
On TPU the engine may route decode to the Pallas kernel instead (`models.paged_tpu`).

A pool may be int8 (`models.kv_int8.Int8Pages`, `RolloutConfig.kv_cache_dtype = "int8"`):
`write_kv` quantises what it writes, and every walk reads pages through `take_pages`, which
dequantises the gathered block only.

Shapes: B sequences, T queries per sequence, N query heads, K kv heads, G = N / K, H head
dim, P pages, ps page size, pps pages per sequence.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from jaxrl_llm.algorithms.masked import compute_dtype
from jaxrl_llm.models.kv_int8 import Int8Pages, Pool, quantize_kv, take_pages
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.rules import ShardingContext

Array = jax.Array
_NEG = float(jnp.finfo(jnp.float32).min)
DEFAULT_PAGE_SIZE = 32  # tokens per page (the engine's default; the planner's assumption)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedBatch:
    """Where a call's new tokens go and what they attend to.

    page_indices [B, pps]; write_slots [B, T] flat slots of the new tokens (>= P * ps: not
    written); kv_lens [B] tokens each row holds after the write (0 = inactive row).
    """

    page_indices: Array
    write_slots: Array
    kv_lens: Array


def combine_kv(k: Array, v: Array) -> Array:
    """[..., K, H] keys and values -> [..., 2K, H], interleaved (k0, v0, k1, v1, ...)."""
    *lead, K, H = k.shape
    return jnp.stack([k, v], axis=-2).reshape(*lead, 2 * K, H)


def write_kv(kv_pages: Pool, k: Array, v: Array, slots: Array) -> Pool:
    """Write keys/values [..., K, H] at flat slots [...] (out of range: dropped). In place
    when `kv_pages` is donated: a scatter of the new tokens only (an int8 pool quantises
    them first, `quantize_kv`)."""
    P, ps, C, H = kv_pages.shape
    new = combine_kv(k, v).reshape(-1, C, H)
    at = slots.reshape(-1)
    if isinstance(kv_pages, Int8Pages):
        q, scale = quantize_kv(new)
        values = kv_pages.values.reshape(P * ps, C, H).at[at].set(q, mode="drop")
        scales = kv_pages.scales.reshape(P * ps, C).at[at].set(scale, mode="drop")
        return Int8Pages(values.reshape(P, ps, C, H), scales.reshape(P, ps, C))
    flat = kv_pages.reshape(P * ps, C, H)
    flat = flat.at[at].set(new.astype(flat.dtype), mode="drop")
    return flat.reshape(P, ps, C, H)


def slots_for(page_indices: Array, positions: Array, write: Array, page_size: int, oob: int):
    """Flat slots [B, T] of tokens at `positions` [B, T] under each row's page table;
    `oob` (one past the pool) where `write` is False."""
    pps = page_indices.shape[1]
    page_no = jnp.clip(positions // page_size, 0, pps - 1)
    pages = jnp.take_along_axis(page_indices, page_no, axis=1)
    return jnp.where(write, pages * page_size + positions % page_size, oob)


def batch_axes(ctx: ShardingContext | None, batch: int) -> tuple[str, ...]:
    """Mesh axes a batch of `batch` rows splits over (empty: not split)."""
    if ctx is None:
        return ()
    spec = ctx.spec((ax.BATCH,), (batch,))
    entry = spec[0] if len(spec) else None
    names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return tuple(n for n in names if ctx.mesh.shape[n] > 1)


def write_and_decode(
    q: Array,
    k: Array,
    v: Array,
    kv_pages: Pool,
    batch: PagedBatch,
    ctx: ShardingContext | None,
    *,
    sm_scale: float,
) -> tuple[Array, Pool]:
    """One decode step's write and attention: q [B, N, H], k/v [B, K, H] -> out [B, N, H]
    and the pool.

    When the rows split over mesh axes, so does the pool, by pages: shard s holds pages
    [s * P/D, (s + 1) * P/D) and the rows on shard s use only those (the engine allocates
    so), and the step runs per shard (`shard_map` over those axes; page ids turned local),
    so no shard reads or writes another's pages. Other axes (tensor) stay automatic.
    """
    names = batch_axes(ctx, q.shape[0])
    if not names:
        kv_pages = write_kv(kv_pages, k, v, batch.write_slots)
        return decode(q, kv_pages, batch.kv_lens, batch.page_indices, sm_scale=sm_scale), kv_pages
    assert ctx is not None

    def per_shard(q, k, v, kv_pages, page_indices, write_slots, kv_lens):
        base = jax.lax.axis_index(names) * kv_pages.shape[0]  # first page of this shard
        kv_pages = write_kv(kv_pages, k, v, write_slots - base * kv_pages.shape[1])
        out = decode(q, kv_pages, kv_lens, page_indices - base, sm_scale=sm_scale)
        return out, kv_pages

    spec = PartitionSpec(names)
    run = jax.shard_map(
        per_shard, mesh=ctx.mesh, in_specs=(spec,) * 7, out_specs=(spec, spec),
        axis_names=set(names), check_vma=False,
    )  # fmt: skip
    return run(q, k, v, kv_pages, batch.page_indices, batch.write_slots[:, 0], batch.kv_lens)


def decode(
    q: Array,
    kv_pages: Pool,
    kv_lens: Array,
    page_indices: Array,
    *,
    sm_scale: float,
    platform: str | None = None,
) -> Array:
    """Decode attention, by platform (default: JAX's default backend):
    - TPU: JAX's Pallas kernel where it supports the shapes (`models.paged_tpu`);
    - GPU: every row's whole page table gathered at once (`gathered_attention`): no
      data-dependent control flow, which XLA:GPU pays for with a host round trip per
      `cond` and per loop iteration (measured on an H200, Qwen2.5-0.5B shape, 1,024-token
      contexts: the walks below ran 2-5x slower than the dense cache; docs/performance.md);
    - CPU (and TPU shapes the kernel refuses): `decode_attention`, which reads only the
      pages in use.
    """
    platform = platform or jax.default_backend()
    if platform == "tpu" and not isinstance(kv_pages, Int8Pages):  # the kernel reads floats
        from jaxrl_llm.models import paged_tpu

        if paged_tpu.tpu_kernel_supported(q, kv_pages, page_indices):
            return paged_tpu.tpu_decode_attention(
                q, kv_pages, kv_lens, page_indices, sm_scale=sm_scale
            )
    if platform == "gpu":
        positions = jnp.maximum(kv_lens - 1, 0)[:, None]
        out = gathered_attention(
            q[:, None], kv_pages, kv_lens, page_indices, positions, sm_scale=sm_scale
        )[:, 0]
        return jnp.where((kv_lens > 0)[:, None, None], out, jnp.zeros((), out.dtype))
    return decode_attention(q, kv_pages, kv_lens, page_indices, sm_scale=sm_scale)


def decode_attention(
    q: Array,
    kv_pages: Pool,
    kv_lens: Array,
    page_indices: Array,
    *,
    sm_scale: float,
) -> Array:
    """Causal attention of one query per sequence over its paged keys: q [B, N, H] ->
    [B, N, H], softmax in float32, by the ragged walk (`_by_item`): the (row, page) items
    in use, `block_pages` of them at a time.

    The one walk of the CPU path. A second walk by page column (every row's first w pages at
    once, w switched over compiled widths, picked per call by a `cond`) doubled the decode
    program's compile (Qwen2.5-0.5B shape: 11.7-15.7 s against 5.0-7.5 s for this walk
    alone) and, with blocks of 2,048 tokens here, decoded faster only on long rows of one
    length where attention is most of a step (the tiny model, 32 x 1,088 tokens: this walk
    7-26% slower; docs/performance.md, 2026-12-07)."""
    B, N, H = q.shape
    ps, K = kv_pages.shape[1], kv_pages.shape[2] // 2
    n_pages = (kv_lens + ps - 1) // ps
    qg = q.reshape(B, K, N // K, H)
    _, denom, o = _by_item(qg, kv_pages, kv_lens, page_indices, n_pages, sm_scale)
    # Inactive rows (kv_len 0) are zero; an active row's NaN (a NaN key it attends: an
    # overflow upstream) stays NaN, as on the GPU path, rather than read as a zero output.
    active = (kv_lens > 0)[:, None, None, None]
    out = jnp.where(active, o / jnp.maximum(denom, 1e-30)[..., None], 0.0)
    return out.reshape(B, N, H).astype(q.dtype)


BLOCK_TOKENS = 2048  # tokens a block of the walk holds at most (its pages: `block_pages`)


def block_pages(batch: int, page_size: int, pages_per_seq: int) -> int:
    """Items (pages) per block of the ragged walk: `BLOCK_TOKENS` of them, or the page
    tables' whole size when that is less (one pass then, reading no page past the tables).
    Larger blocks run fewer loop iterations of larger products: at 512 tokens a block the
    walk decoded 11-80% slower than at 2,048 on rows of one length (docs/performance.md)."""
    return max(1, min(BLOCK_TOKENS // page_size, batch * pages_per_seq))


def pages_read(kv_lens, page_size: int, pages_per_seq: int) -> int:
    """Pages one layer's decode attention gathers for rows holding `kv_lens` tokens (numpy;
    the benchmarks' accounting): every block the walk runs, its last one whole (the items
    past the pages in use are gathered too, and masked)."""
    block = block_pages(len(kv_lens), page_size, pages_per_seq)
    in_use = int(np.sum((np.asarray(kv_lens) + page_size - 1) // page_size))
    return -(-in_use // block) * block


def _init(qg: Array):
    B, K, G, H = qg.shape
    acc = compute_dtype(qg)
    return (
        jnp.full((B, K, G), _NEG, acc),
        jnp.zeros((B, K, G), acc),
        jnp.zeros((B, K, G, H), acc),
    )


def _block_stats(qg, blk, ok, sm_scale):
    """Per-item softmax statistics of a block: qg [C, K, G, H], blk [C, t, 2K, H] keys and
    values, ok [C, t] -> max [C, K, G], sum [C, K, G], unnormalised output [C, K, G, H].
    Slots outside `ok` may hold inf or NaN (module docstring): scores are masked by a select
    and values zeroed, as p = 0 alone leaves 0 * inf = NaN in the p . v product."""
    kb, vb = blk[:, :, 0::2], blk[:, :, 1::2]
    vb = jnp.where(ok[:, :, None, None], vb, jnp.zeros((), vb.dtype))
    acc = compute_dtype(qg)
    s = jnp.einsum("ckgh,cpkh->ckgp", qg, kb, preferred_element_type=acc)
    mask = ok[:, None, None, :]
    s = jnp.where(mask, s * sm_scale, _NEG)
    m_i = jnp.max(s, axis=-1)
    p = jnp.where(mask, jnp.exp(s - m_i[..., None]), 0.0)
    o_i = jnp.einsum("ckgp,cpkh->ckgh", p.astype(vb.dtype), vb, preferred_element_type=acc)
    return m_i, jnp.sum(p, axis=-1), o_i


def _by_item(qg, kv_pages, kv_lens, page_indices, n_pages, sm_scale):
    """Online softmax over a ragged list of (row, page) items, a block at a time."""
    B, pps = page_indices.shape
    ps = kv_pages.shape[1]
    block = block_pages(B, ps, pps)
    ends = jnp.cumsum(n_pages)
    starts = ends - n_pages
    total = ends[-1]
    seg: dict[str, Any] = dict(num_segments=B, indices_are_sorted=True)

    def body(c, carry):
        m, total_p, o = carry
        item = c * block + jnp.arange(block)
        live = item < total
        row = jnp.clip(jnp.searchsorted(ends, item, side="right"), 0, B - 1)
        j = jnp.clip(item - starts[row], 0, pps - 1)
        blk = take_pages(kv_pages, page_indices[row, j])  # [block, ps, 2K, H]
        pos = j[:, None] * ps + jnp.arange(ps)[None, :]
        ok = live[:, None] & (pos < kv_lens[row][:, None])
        m_i, l_i, o_i = _block_stats(qg[row], blk, ok, sm_scale)
        m_new = jnp.maximum(m, jax.ops.segment_max(m_i, row, **seg))
        a_old = jnp.exp(m - m_new)
        a_i = jnp.where(live[:, None, None], jnp.exp(m_i - m_new[row]), 0.0)
        total_p = total_p * a_old + jax.ops.segment_sum(l_i * a_i, row, **seg)
        o = o * a_old[..., None] + jax.ops.segment_sum(o_i * a_i[..., None], row, **seg)
        return m_new, total_p, o

    return jax.lax.fori_loop(0, (total + block - 1) // block, body, _init(qg))


def gathered_attention(
    q: Array,
    kv_pages: Pool,
    kv_lens: Array,
    page_indices: Array,
    positions: Array,
    *,
    sm_scale: float,
) -> Array:
    """Causal attention of T queries per sequence (at `positions` [B, T]) over the row's
    whole page table, gathered densely: q [B, T, N, H] -> [B, T, N, H]. Values past a row's
    length are zeroed (module docstring); the row's own later tokens, masked for an earlier
    query by p = 0 only, reach it if not finite (as in `self_attention.attend`)."""
    B, T, N, H = q.shape
    K = kv_pages.shape[2] // 2
    blk = take_pages(kv_pages, page_indices)  # [B, pps, ps, 2K, H]
    kv = blk.reshape(B, -1, 2 * K, H)
    k, v = kv[:, :, 0::2], kv[:, :, 1::2]
    key_pos = jnp.arange(kv.shape[1])
    in_row = key_pos[None, :, None, None] < kv_lens[:, None, None, None]
    v = jnp.where(in_row, v, jnp.zeros((), v.dtype))  # 0 * inf = NaN: see `_block_stats`
    mask = (key_pos[None, None, :] <= positions[:, :, None]) & (
        key_pos[None, None, :] < kv_lens[:, None, None]
    )
    qg = q.reshape(B, T, K, N // K, H)
    acc = compute_dtype(q)
    s = jnp.einsum("btkgh,bskh->bkgts", qg, k.astype(q.dtype), preferred_element_type=acc)
    s = jnp.where(mask[:, None, None], s * sm_scale, _NEG)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", p, v.astype(q.dtype))
    return out.reshape(B, T, N, H)

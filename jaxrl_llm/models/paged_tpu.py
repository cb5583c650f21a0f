"""Decode attention over the paged KV cache with JAX's Pallas TPU kernel.

Layout (that of `jax.experimental.pallas.ops.tpu.ragged_paged_attention`, shared with the
pure-JAX `jaxrl_llm.models.paged.decode_attention`): per layer `kv_pages [num_pages,
page_size, 2K, H]`, combined head 2k = key head k and 2k+1 = value head k; `page_indices
[B, pages_per_seq]` int32; `kv_lens [B]` int32 = cached tokens INCLUDING the current query
token, 0 for an inactive row. Decode is one query per row, `q [B, N, H]`, N % K == 0 (GQA:
query head n reads KV head n // (N // K)).

Used on a TPU backend when `tpu_kernel_supported` is true; otherwise callers use the
pure-JAX function. The decode case is the kernel's ragged call with `cu_q_lens =
arange(B + 1)`, `num_seqs = [B]`. The kernel needs q_len <= kv_len for every row it runs,
and a row with kv_len 0 is skipped without consuming the KV block prefetched for it, so
the NEXT row's first block is that one (the skipped row's page 0; seen in a patched
interpret run) and the skipped row returns uninitialised scratch. The wrapper therefore
runs inactive rows with kv_len 1 and zeroes their output. Page ids are clipped into range
(a bad id would be a DMA fault on TPU).

CPU interpret mode does not run this kernel in JAX 0.10.2 (tests/models/test_paged_tpu.py
probes it and runs the comparisons once it does):
- `interpret=pltpu.InterpretParams()` (TPU interpret mode) fails at run time with
  "AttributeError: 'ReshapeTransform' object has no attribute 'indices'": the kernel
  reshapes its VMEM KV ref, and the interpreter's `to_range` only takes index transforms.
  With that reshape done on the loaded value instead (a patched copy), the kernel matches
  the reference to ~6e-7, but masked stores then trip an interpreter bound check
  ("Out-of-bounds masked swap") when num_queries_per_block > N // K.
- `interpret=True` (HLO interpreter) fails while tracing: "AttributeError: 'TypedInt'
  object has no attribute 'shape'" in pallas `_swap_discharge_rule`.
"""

import contextlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

_KV_TOKENS_PER_BLOCK = 512  # per flash block: double-buffered KV <= 4 MiB VMEM at H=128
_MAX_SEQS_PER_BLOCK = 32  # the kernel's own default query block


class Support(NamedTuple):
    """Truthy only when supported; `reason` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def tpu_kernel_supported(q, kv_pages, page_indices, *, platform: str | None = None) -> Support:
    """Whether the Pallas kernel can take these shapes/dtypes on `platform` (default: the
    default backend). Conservative: upstream tests only head_dim 128 and page_size 16."""
    platform = platform or jax.default_backend()
    if platform != "tpu":
        return Support(False, f"Pallas TPU kernel needs a TPU backend, not {platform!r}")
    if q.ndim != 3 or kv_pages.ndim != 4 or page_indices.ndim != 2:
        return Support(False, "expected q [B,N,H], kv_pages [P,ps,2K,H], page_indices [B,pps]")
    (b, n, h), (_, page_size, kk, hk) = q.shape, kv_pages.shape
    if page_indices.shape[0] != b or page_indices.dtype != jnp.int32:
        return Support(False, f"page_indices must be int32 [{b}, pages_per_seq]")
    if h != hk or kk % 2 or n % (kk // 2):
        return Support(False, f"bad heads: q {q.shape}, kv_pages {kv_pages.shape}")
    if q.dtype not in (jnp.float32, jnp.bfloat16) or kv_pages.dtype != q.dtype:
        return Support(
            False, f"dtypes must both be float32 or bfloat16: {q.dtype}, {kv_pages.dtype}"
        )
    if h % 128:
        return Support(False, f"head_dim {h} is not a multiple of 128 (kernel asserts it)")
    if page_size % 16:
        return Support(False, f"page_size {page_size} is not a multiple of 16")
    try:  # 2K must tile: 2K / packing in (1, 2, 4, 8) or a multiple of 8
        rpa.get_min_heads_per_blk(n, kk, q.dtype, kv_pages.dtype)
    except ValueError as e:
        return Support(False, str(e))
    return Support(True)


def block_sizes(page_size: int, pages_per_seq: int, batch: int) -> tuple[int, int]:
    """(num_kv_pages_per_block, num_queries_per_block), valid for any small shape."""
    kv_pages = min(pages_per_seq, max(1, _KV_TOKENS_PER_BLOCK // page_size))
    return kv_pages, min(batch, _MAX_SEQS_PER_BLOCK)


def decode_args(q, kv_pages, kv_lens, page_indices):
    """The kernel's ragged arguments for decode: (q, kv_pages, kv_lens, page_indices,
    cu_q_lens, num_seqs), inactive rows at kv_len 1 and page ids clipped into range."""
    b = q.shape[0]
    kv_lens = jnp.maximum(kv_lens.astype(jnp.int32), 1)
    page_indices = jnp.clip(page_indices.astype(jnp.int32), 0, kv_pages.shape[0] - 1)
    cu_q_lens = jnp.arange(b + 1, dtype=jnp.int32)
    return q, kv_pages, kv_lens, page_indices, cu_q_lens, jnp.array([b], jnp.int32)


def mask_inactive(out, kv_lens):
    """Zero the rows with kv_len 0 (the pure-JAX contract)."""
    return jnp.where((kv_lens > 0)[:, None, None], out, jnp.zeros((), out.dtype))


def tpu_decode_attention(
    q,
    kv_pages,
    kv_lens,
    page_indices,
    *,
    sm_scale: float,
    interpret: bool | pltpu.InterpretParams = False,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
):
    """One query per row: q [B, N, H] -> [B, N, H]; rows with kv_len 0 return zeros.
    `interpret` runs the kernel in TPU interpret mode (True = default InterpretParams)."""
    bkv, bq = block_sizes(kv_pages.shape[1], page_indices.shape[1], q.shape[0])
    params = pltpu.InterpretParams() if interpret is True else interpret
    with pltpu.force_tpu_interpret_mode(params) if params else contextlib.nullcontext():
        out = rpa.ragged_paged_attention(
            *decode_args(q, kv_pages, kv_lens, page_indices),
            sm_scale=float(sm_scale),
            num_kv_pages_per_block=num_kv_pages_per_block or bkv,
            num_queries_per_block=num_queries_per_block or bq,
            vmem_limit_bytes=vmem_limit_bytes,
        )
    return mask_inactive(out, kv_lens)

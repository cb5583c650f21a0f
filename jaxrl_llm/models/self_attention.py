"""Self-attention of full (uncached) forwards: causal, within packed segments, padding apart.

A full forward describes its mask by `Segments`, ids [B, T]: token t may attend token s when
s <= t and both carry the same id. Packed rows give each sequence its own id (1, 2, ...);
padding gets id 0, so real tokens never attend padding and a padding token attends only
earlier padding (never an empty row: every token attends at least itself). No [B, T, T]
mask is built for the whole batch.

Two implementations, equal on every position (`tests/models/test_self_attention.py`):
- `causal_attend` (XLA, every backend): query blocks of `CAUSAL_BLOCK` rows, each reading
  keys up to the block's end, so score blocks above the diagonal are never computed;
- `splash_attend`: JAX's Pallas splash-attention kernel (TPU), flash-style: scores live in
  VMEM one block at a time, and key blocks a segment or the causal mask hide are skipped.
  On another backend it runs in Pallas interpret mode (tests only: slow).
`ModelConfig.attention` picks one ("auto": splash on a TPU where `splash_supported`, else
XLA). GQA: query head n reads key/value head n // (N // K).

Shapes: B batch, T tokens, N query heads, K kv heads, G = N / K, H head dim.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import PartitionSpec

from jaxrl_llm.algorithms.masked import compute_dtype
from jaxrl_llm.models.config import ATTENTION_IMPLS
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.rules import ShardingContext

Array = jax.Array

# Query rows per block of `causal_attend`: T = 2,560 runs as 10 blocks, 55% of the dense work.
CAUSAL_BLOCK = 256
# Splash's query/key block (rows padded up to a multiple): 512 as in MaxText's defaults,
# smaller for short rows.
SPLASH_BLOCK = 512


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Segments:
    """Which tokens of a full forward attend each other: ids [B, T] int32 (0 = padding)."""

    ids: Array

    @classmethod
    def of(cls, attention_mask: Array | None, segment_ids: Array | None, shape) -> Segments:
        """From a 0/1 attention mask (None: no padding) and packed segment ids (None: one
        sequence a row) of rows of `shape` [B, T]."""
        ids = jnp.ones(shape, jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
        if attention_mask is not None:
            ids = jnp.where(attention_mask.astype(jnp.bool_), ids, 0)
        return cls(ids)

    def dense(self, rows: slice = slice(None), keys: slice = slice(None)) -> Array:
        """The boolean mask [B, rows, keys] (True = may attend)."""
        length = self.ids.shape[1]
        t = jnp.arange(length)[rows][:, None]
        s = jnp.arange(length)[keys][None, :]
        same = self.ids[:, rows, None] == self.ids[:, None, keys]
        return same & (s <= t)[None]


def self_attend(
    q: Array, k: Array, v: Array, segments: Segments, scale: float, impl: str, ctx=None
) -> Array:
    """q [B,T,N,H], k/v [B,T,K,H] -> [B,T,N,H] by `impl` (one of `ATTENTION_IMPLS`)."""
    assert impl in ATTENTION_IMPLS, impl
    if impl == "splash" or (impl == "auto" and splash_supported(q, k)):
        return splash_attend(q, k, v, segments, scale, ctx)
    return causal_attend(q, k, v, segments, scale)


def causal_attend(
    q: Array, k: Array, v: Array, segments: Segments, scale: float, block: int = CAUSAL_BLOCK
) -> Array:
    """Dense attention in causal query blocks: block [t0, t1) reads keys [0, t1) only, about
    (n + 1) / 2n of the dense scores, softmax and products for n blocks (and as much less
    activation memory in training). Each block's mask comes from the segment ids."""
    length = q.shape[1]
    outs = []
    for t0 in range(0, length, block):
        rows, keys = slice(t0, t0 + block), slice(0, t0 + block)
        mask = segments.dense(rows, keys)
        outs.append(attend(q[:, rows], k[:, keys], v[:, keys], mask, scale))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def splash_supported(q: Array, k: Array, *, platform: str | None = None) -> bool:
    """Conservative: a TPU backend, head_dim a multiple of 128 (the lane width), float32 or
    bfloat16 (the shapes upstream tests)."""
    platform = platform or jax.default_backend()
    ok_dtype = q.dtype in (jnp.float32, jnp.bfloat16) and k.dtype == q.dtype
    return platform == "tpu" and q.shape[-1] % 128 == 0 and ok_dtype


@functools.lru_cache(maxsize=32)
def _kernel(length: int, groups: int, block: int, interpret: bool):
    """A splash MQA kernel for one kv head's G query heads over rows of `length` tokens.

    Built with concrete arrays even when first asked for inside a trace (a jitted step): the
    kernel holds its mask's block tables as arrays, and this cache outlives the trace, so a
    table built from tracers would leak into the next program that uses the kernel."""
    mask = masks.MultiHeadMask([masks.CausalMask((length, length)) for _ in range(groups)])
    sizes = splash.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        block_q_dq=block, block_kv_dq=block,
    )  # fmt: skip
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def _splash_local(q: Array, k: Array, v: Array, ids: Array, scale: float) -> Array:
    """`splash_attend` on the rows and heads of one device."""
    B, T, N, H = q.shape
    K = k.shape[2]
    block = min(SPLASH_BLOCK, -(-T // 128) * 128)
    padded = -(-T // block) * block
    if padded != T:  # extra rows: a segment of their own (-1), cut off below
        widths = ((0, 0), (0, padded - T), (0, 0), (0, 0))
        q, k, v = (jnp.pad(x, widths) for x in (q, k, v))
        ids = jnp.pad(ids, ((0, 0), (0, padded - T)), constant_values=-1)
    kernel = _kernel(padded, N // K, block, jax.default_backend() != "tpu")
    qg = (q * scale).reshape(B, padded, K, N // K, H).transpose(0, 2, 3, 1, 4)  # [B,K,G,T,H]
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B,K,T,H]

    def one(q, k, v, ids):
        return kernel(q, k, v, segment_ids=splash.SegmentIds(q=ids, kv=ids))

    per_row = jax.vmap(one, in_axes=(0, 0, 0, None))  # over kv heads
    out = jax.vmap(per_row)(qg, kt, vt, ids)  # [B,K,G,T,H]
    return out.transpose(0, 3, 1, 2, 4).reshape(B, padded, N, H)[:, :T]


def splash_attend(
    q: Array, k: Array, v: Array, segments: Segments, scale: float, ctx: ShardingContext | None
) -> Array:
    """Attention through the splash kernel. Under a mesh it runs per device (`shard_map`):
    rows split as the batch is, heads as the kv heads are (the query heads follow, so each
    device holds whole GQA groups); the kernel cannot be partitioned automatically."""
    if ctx is None:
        return _splash_local(q, k, v, segments.ids, scale)
    B, K = q.shape[0], k.shape[2]
    rows = ctx.spec((ax.BATCH,), (B,))
    heads = ctx.spec((ax.ACT_KV_HEADS,), (K,))
    rows = rows[0] if len(rows) else None
    heads = heads[0] if len(heads) else None
    qkv = PartitionSpec(rows, None, heads, None)
    run = jax.shard_map(
        functools.partial(_splash_local, scale=scale), mesh=ctx.mesh,
        in_specs=(qkv, qkv, qkv, PartitionSpec(rows)), out_specs=qkv, check_vma=False,
    )  # fmt: skip
    return run(q, k, v, segments.ids)


def attend(q: Array, k: Array, v: Array, mask: Array, scale: float) -> Array:
    """softmax(q k^T * scale, masked) v with GQA. q [B,T,N,H], k/v [B,S,K,H], mask [B,T,S]."""
    B, T, N, H = q.shape
    K = k.shape[2]
    qg = q.reshape(B, T, K, N // K, H)
    acc = compute_dtype(q)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=acc)
    scores = scores * scale
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(acc).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v)
    return out.reshape(B, T, N, H)

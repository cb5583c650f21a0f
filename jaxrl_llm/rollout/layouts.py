"""Where the engine's device state lives on the sampling mesh: the shardings of its decode
state, prompt prefixes and step records, from the engine's logical-axis rules.

Slots split over the mesh's batch axes (`models.paged.batch_axes`) and the page pool with
them (shard s's slots use shard s's pages); kv heads split over `tensor` as the model's
projections do; a prefix's cache splits by layer, sequence and kv head.

Shapes: B slots, NP pages in the pool, ps page size, pps pages per sequence, P padded
prompt, L layers, K kv heads, H head dim, D embed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.models import KVCache
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.kv_int8 import Int8Pages
from jaxrl_llm.rollout.records import DecodeState, Prefix, StepRecords
from jaxrl_llm.rollout.sampling import SlotSampling
from jaxrl_llm.sharding import ShardingContext
from jaxrl_llm.sharding import axes as ax


def replicated(ctx: ShardingContext) -> NamedSharding:
    return NamedSharding(ctx.mesh, PartitionSpec())


def decode_state(
    ctx: ShardingContext,
    cfg: ModelConfig,
    *,
    batch: int,
    num_pages: int,
    page_size: int,
    pages_per_seq: int,
    batch_axes: Sequence[str],
    kv_dtype: np.dtype,
) -> DecodeState[NamedSharding]:
    """The decode state's shardings: a pool [NP, ps, K, H] a layer, slot rows [B, ...]."""
    # Pages split over the slots' batch axes; kv heads over `tensor` as the projections do
    # (decided on K, applied to 2K).
    pool_shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
    heads = ctx.spec((None, None, ax.ACT_KV_HEADS, None), pool_shape)
    heads = heads[2] if len(heads) > 2 else None
    pool = NamedSharding(ctx.mesh, PartitionSpec(tuple(batch_axes) or None, None, heads))
    b = ctx.sharding((ax.BATCH,), (batch,))
    # An int8 pool's scales [NP, ps, 2K] split as its values [NP, ps, 2K, H] do.
    layer = Int8Pages(pool, pool) if kv_dtype == np.int8 else pool
    return DecodeState(
        kv_pages=(layer,) * cfg.num_layers,
        page_table=ctx.sharding((ax.BATCH, None), (batch, pages_per_seq)),
        hidden=ctx.sharding((ax.BATCH, ax.ACT_EMBED), (batch, cfg.hidden_size)),
        lengths=b,
        generated=b,
        max_new=b,
        active=b,
        sampling=SlotSampling(b, b, b, b, b),
    )


def prefix(ctx: ShardingContext, cfg: ModelConfig, max_prefill: int) -> Prefix[NamedSharding]:
    """A prefill's output: its cache [L, 1, P, K, H] and two replicated arrays."""
    shape = (cfg.num_layers, 1, max_prefill, cfg.num_kv_heads, cfg.head_dim)
    c = ctx.sharding((ax.LAYERS, None, ax.CACHE_SEQ, ax.ACT_KV_HEADS, None), shape)
    return Prefix(KVCache(c, c), replicated(ctx), replicated(ctx))


def step_records(ctx: ShardingContext, batch: int) -> StepRecords[NamedSharding]:
    """A decode call's records [k, B], split by slot."""
    r = ctx.sharding((None, ax.BATCH), (1, batch))
    return StepRecords(r, r, r, r, r)

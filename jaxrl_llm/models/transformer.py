"""Decoder-only transformer (Qwen2/Qwen2.5, Llama-3) in Flax NNX, a KV cache, a value model.

Public call: `model(input_ids, positions=None, attention_mask=None) -> logits [B, T, V]`.
Positions default to `cumsum(attention_mask) - 1`, so left-padded rows get the positions
their unpadded tokens would have.

Cached decoding uses `extend`: it appends T tokens to each row of a `KVCache` whose row b
already holds `start[b]` tokens at cache indices [0, start[b]) with positions equal to those
indices. Prefill is `extend` from start 0; one decode step is `extend` with T = 1; appending
a tool's output to a live sequence is `extend` with the output's tokens.

Shapes: B batch, T tokens, S cache length, D embed, V vocab, L layers, K kv heads, H head dim.
"""

from __future__ import annotations

import dataclasses
from typing import Generic

import jax
import jax.numpy as jnp
from flax import nnx
from typing_extensions import TypeVar  # `default=` (PEP 696) before Python 3.13

from jaxrl_llm.algorithms.masked import compute_dtype
from jaxrl_llm.models.config import ModelConfig, as_dtype
from jaxrl_llm.models.int8_cpu import int8_matmul
from jaxrl_llm.models.kv_int8 import Pool
from jaxrl_llm.models.layers import (
    MLP,
    Attention,
    RMSNorm,
    make_param,
    rope_cos_sin,
    rope_inv_freq,
)
from jaxrl_llm.models.paged import PagedBatch, slots_for
from jaxrl_llm.models.quant import INT8_ACTIVATIONS, SCALE_SUFFIX, int8_product
from jaxrl_llm.models.self_attention import Segments
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.rules import ShardingContext, constrain

Array = jax.Array
# The leaves of a `KVCache`: `jax.Array` (the default), `NamedSharding` in the rollout
# engine's sharding pytrees.
Leaf = TypeVar("Leaf", default=jax.Array)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache(Generic[Leaf]):
    """Keys and values for every layer: k, v [L, B, S, K, H]."""

    k: Leaf
    v: Leaf

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, length: int, dtype=None) -> KVCache:
        dtype = as_dtype(dtype or cfg.dtype)
        shape = (cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    @staticmethod
    def logical_axes() -> tuple:
        return (ax.LAYERS, ax.BATCH, ax.CACHE_SEQ, ax.ACT_KV_HEADS, None)

    @property
    def length(self: KVCache) -> int:
        return self.k.shape[2]


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = as_dtype(cfg.param_dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=pd, rngs=rngs)
        self.self_attn = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, param_dtype=pd, rngs=rngs
        )
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, cos, sin, mask, kv_cache, write_index, ctx):
        h, new_cache = self.self_attn(
            self.input_layernorm(x), cos, sin, mask, kv_cache, write_index, ctx
        )
        return self._rest(x, h, ctx), new_cache

    def paged(self, x, cos, sin, kv_pages, batch: PagedBatch, positions, ctx):
        h, kv_pages = self.self_attn.paged(
            self.input_layernorm(x), cos, sin, kv_pages, batch, positions, ctx
        )
        return self._rest(x, h, ctx), kv_pages

    def _rest(self, x, h, ctx):
        """Residual, post-attention norm, MLP, residual."""
        x = constrain(x + h, (ax.BATCH, ax.SEQ, ax.ACT_EMBED), ctx)
        x = x + self.mlp(self.post_attention_layernorm(x), ctx)
        return constrain(x, (ax.BATCH, ax.SEQ, ax.ACT_EMBED), ctx)


class Decoder(nnx.Module):
    """Embedding, L decoder layers, final norm: the trunk shared by policy and critic."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = as_dtype(cfg.param_dtype)
        self.embed_tokens = make_param(
            rngs, nnx.initializers.normal(0.02), (cfg.vocab_size, cfg.hidden_size),
            (ax.VOCAB, ax.EMBED), pd,
        )  # fmt: skip
        self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=pd, rngs=rngs)
        self.config = cfg

    def __call__(
        self,
        input_ids: Array,
        positions: Array,
        mask: Array | Segments,
        cache: KVCache | None,
        write_index: Array | None,
        ctx: ShardingContext | None,
    ) -> tuple[Array, KVCache | None]:
        """Final-norm hidden states [B, T, D] and the updated cache. `mask`: the `Segments`
        of a full forward (no cache), else [B, T, S] over the cache."""
        x, cos, sin = self._embed(input_ids, positions, ctx)
        if cache is None and self.config.scan_layers and len(self.layers) > 1:
            return self.norm(self._scanned(x, cos, sin, mask, ctx)), None

        def run_layer(layer, x, layer_cache):
            return layer(x, cos, sin, mask, layer_cache, write_index, ctx)

        if self.config.remat and cache is None:
            # Per-layer rematerialisation for training forwards (cached decoding keeps no
            # activations for a backward pass). jax.checkpoint over the layer's split state,
            # not nnx.remat: the model may have been merged at an outer trace level (inside
            # lax.map / scan bodies), where nnx.remat refuses to touch its Variables.
            plain = run_layer

            def run_layer(layer, x, layer_cache):
                layer_def, layer_state = nnx.split(layer)
                pure = lambda st, h: plain(nnx.merge(layer_def, st), h, None)
                return jax.checkpoint(pure)(layer_state, x)

        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache.k[i], cache.v[i])
            x, layer_cache = run_layer(layer, x, layer_cache)
            if layer_cache is not None:
                new_k.append(layer_cache[0])
                new_v.append(layer_cache[1])
        new_cache = None
        if cache is not None:
            new_cache = KVCache(jnp.stack(new_k), jnp.stack(new_v))
            new_cache = KVCache(
                constrain(new_cache.k, KVCache.logical_axes(), ctx),
                constrain(new_cache.v, KVCache.logical_axes(), ctx),
            )
        return self.norm(x), new_cache

    def _scanned(self, x: Array, cos: Array, sin: Array, mask: Segments, ctx) -> Array:
        """The layers of an uncached forward as one `lax.scan` over their stacked states.

        The program holds one layer's body instead of L copies, so compile time stops growing
        with depth. The parameters stay one module per layer (the layout HF I/O, sharding,
        checkpoints and the decode engine read in place); the stack is built inside the
        forward: one extra read and write of the layer weights per forward (and the same for
        their gradients). With `remat` each layer is recomputed in the backward pass, as in
        the unrolled path. On XLA:CPU this is slower to compile and to run than the unrolled
        layers (measured in docs/performance.md), hence off by default.
        """
        graphdef, first = nnx.split(self.layers[0])
        states = [first, *(nnx.split(layer)[1] for layer in self.layers[1:])]
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)

        def body(h, layer_state):
            h, _ = nnx.merge(graphdef, layer_state)(h, cos, sin, mask, None, None, ctx)
            return h, None

        if self.config.remat:
            body = jax.checkpoint(body)
        x, _ = jax.lax.scan(body, x, stacked)
        return x

    def paged(
        self,
        input_ids: Array,
        positions: Array,
        kv_pages: tuple[Pool, ...],
        batch: PagedBatch,
        ctx: ShardingContext | None,
    ) -> tuple[Array, tuple[Pool, ...]]:
        """Final-norm hidden states [B, T, D] of tokens appended to paged sequences, and
        the per-layer page pools with their keys/values written (each updated in place
        when donated: no per-step copy of the cache)."""
        x, cos, sin = self._embed(input_ids, positions, ctx)
        new_pages = []
        for layer, pages in zip(self.layers, kv_pages, strict=True):
            x, pages = layer.paged(x, cos, sin, pages, batch, positions, ctx)
            new_pages.append(pages)
        return self.norm(x), tuple(new_pages)

    def _embed(self, input_ids: Array, positions: Array, ctx: ShardingContext | None):
        """Token embeddings [B, T, D] and the rotary cos/sin of `positions`."""
        dtype = as_dtype(self.config.dtype)
        x = jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(dtype)
        scale = getattr(self, "embed_tokens" + SCALE_SUFFIX, None)  # an int8 table's rows
        if scale is not None:
            x = x * jnp.take(scale[...], input_ids, axis=0)[..., None].astype(dtype)
        x = constrain(x, (ax.BATCH, ax.SEQ, ax.ACT_EMBED), ctx)
        inv_freq = rope_inv_freq(self.config.head_dim, self.config.rope)
        cos, sin = rope_cos_sin(positions, inv_freq, dtype)
        return x, cos, sin


def default_positions(input_ids: Array, attention_mask: Array | None) -> Array:
    """cumsum(mask) - 1, clipped at 0 (pads get position 0); arange without a mask."""
    if attention_mask is None:
        T = input_ids.shape[1]
        return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), input_ids.shape)
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


class _Trunked(nnx.Module):
    """Shared plumbing for models built on a `Decoder` trunk."""

    model: Decoder
    config: ModelConfig
    sharding_ctx: ShardingContext | None

    def hidden_states(
        self,
        input_ids: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
    ) -> Array:
        """Final hidden states [B, T, D] of a full (uncached) forward. With `segment_ids`
        [B, T] a row holds several packed sequences: tokens attend within their own segment
        only, and `positions` should restart at 0 in each."""
        if positions is None:
            positions = default_positions(input_ids, attention_mask)
        segments = Segments.of(attention_mask, segment_ids, input_ids.shape)
        h, _ = self.model(input_ids, positions, segments, None, None, self.sharding_ctx)
        return h

    def set_sharding(self, ctx: ShardingContext | None) -> None:
        """Use `ctx` for activation constraints (static: re-traces jitted callers)."""
        self.sharding_ctx = ctx


class CausalLM(_Trunked):
    """The policy: `Decoder` + LM head (tied to the embedding when the config says so)."""

    def __init__(
        self, cfg: ModelConfig, *, rngs: nnx.Rngs, sharding: ShardingContext | None = None
    ):
        self.config = cfg
        self.model = Decoder(cfg, rngs=rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = make_param(
                rngs, nnx.initializers.normal(0.02), (cfg.hidden_size, cfg.vocab_size),
                (ax.EMBED, ax.VOCAB), as_dtype(cfg.param_dtype),
            )  # fmt: skip
        self.sharding_ctx = sharding

    def __call__(
        self,
        input_ids: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
    ) -> Array:
        """Logits [B, T, V] in float32 (`segment_ids`: packed rows, as `hidden_states`)."""
        return self.logits(self.hidden_states(input_ids, positions, attention_mask, segment_ids))

    def logits(self, hidden: Array) -> Array:
        """Project hidden states [..., D] to float32 logits [..., V] (float64 for a float64
        model: a reference run)."""
        acc = compute_dtype(hidden)
        tied = self.config.tie_word_embeddings
        owner, name = (self.model, "embed_tokens") if tied else (self, "lm_head")
        scale = getattr(owner, name + SCALE_SUFFIX, None)  # the sampler's int8 copy
        if scale is not None:
            out = self._int8_logits(hidden, getattr(owner, name)[...], scale[...], tied)
        else:
            w = self.model.embed_tokens[...].T if tied else self.lm_head[...]
            out = jnp.einsum(
                "...d,dv->...v", hidden, w.astype(hidden.dtype), preferred_element_type=acc
            )
        if out.ndim == 3:
            out = constrain(out, (ax.BATCH, ax.SEQ, ax.ACT_VOCAB), self.sharding_ctx)
        return out

    def _int8_logits(self, hidden: Array, q: Array, scale: Array, tied: bool) -> Array:
        """Logits from the sampler's int8 head (`models.quant`): the embedding [V, D] when
        tied (one scale per row = per logit), else lm_head [D, V]; W8A8 when marked."""
        spec = "...d,vd->...v" if tied else "...d,dv->...v"
        if vars(self).get(INT8_ACTIVATIONS, False):
            return int8_product(spec, hidden, q, scale, 1).astype(jnp.float32)

        def xla(h: Array, q: Array, scale: Array) -> Array:
            out = jnp.einsum(spec, h, q.astype(h.dtype), preferred_element_type=jnp.float32)
            return out * scale.astype(jnp.float32)

        return int8_matmul(hidden, q, scale, xla, transposed=tied)

    def extend(
        self,
        cache: KVCache,
        input_ids: Array,
        start: Array,
        lengths: Array | None = None,
    ) -> tuple[Array, KVCache]:
        """Append tokens [B, T] to each cached row; returns hidden states [B, T, D] and cache.

        Row b already holds `start[b]` tokens. Its first `lengths[b]` new tokens (all T by
        default) are written at cache indices start[b] + t with positions start[b] + t; the
        rest are padding: not written, and their outputs are meaningless.
        """
        T = input_ids.shape[1]
        S = cache.length
        offsets = jnp.arange(T, dtype=jnp.int32)[None, :]
        positions = start[:, None].astype(jnp.int32) + offsets
        if lengths is None:
            write_index = positions
        else:
            write_index = jnp.where(offsets < lengths[:, None], positions, S)
        mask = jnp.arange(S)[None, None, :] <= positions[:, :, None]
        h, cache = self.model(input_ids, positions, mask, cache, write_index, self.sharding_ctx)
        return h, cache

    def extend_paged(
        self,
        kv_pages: tuple[Pool, ...],
        page_indices: Array,
        input_ids: Array,
        start: Array,
        lengths: Array,
    ) -> tuple[Array, tuple[Pool, ...]]:
        """`extend` on a paged cache (`models.paged`): row b holds `start[b]` tokens in the
        pages `page_indices[b]`; its first `lengths[b]` new tokens (0: an inactive row) are
        written there and attend over the row. Returns hidden states [B, T, D] and pools."""
        T = input_ids.shape[1]
        P, ps = kv_pages[0].shape[:2]
        offsets = jnp.arange(T, dtype=jnp.int32)[None, :]
        positions = start[:, None].astype(jnp.int32) + offsets
        write = offsets < lengths[:, None]
        batch = PagedBatch(
            page_indices=page_indices,
            write_slots=slots_for(page_indices, positions, write, ps, P * ps),
            kv_lens=jnp.where(lengths > 0, start + lengths, 0).astype(jnp.int32),
        )
        return self.model.paged(input_ids, positions, kv_pages, batch, self.sharding_ctx)


class ValueModel(_Trunked):
    """The critic: the same trunk with a scalar head (`score`, as HF token classification)."""

    def __init__(
        self, cfg: ModelConfig, *, rngs: nnx.Rngs, sharding: ShardingContext | None = None
    ):
        self.config = cfg
        self.model = Decoder(cfg, rngs=rngs)
        self.score = make_param(
            rngs, nnx.initializers.zeros, (cfg.hidden_size, 1), (ax.EMBED, None),
            as_dtype(cfg.param_dtype),
        )  # fmt: skip
        self.score_bias = make_param(
            rngs, nnx.initializers.zeros, (1,), (None,), as_dtype(cfg.param_dtype)
        )
        self.sharding_ctx = sharding

    def __call__(
        self,
        input_ids: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
    ) -> Array:
        """Values [B, T] in float32 (`segment_ids`: packed rows, as `hidden_states`)."""
        h = self.hidden_states(input_ids, positions, attention_mask, segment_ids)
        acc = compute_dtype(h)
        v = jnp.einsum(
            "btd,do->bto", h, self.score[...].astype(h.dtype), preferred_element_type=acc
        )
        return v[..., 0] + self.score_bias[...][0].astype(acc)

"""Transformer building blocks: RMSNorm, rotary embeddings, GQA attention, SwiGLU MLP.

Numerics follow Hugging Face's Qwen2/Llama modelling code (the reference the parity tests
use): RMSNorm normalises in float32 and casts back before the weight; rotary angles are
computed in float32; attention softmax runs in float32; masked scores use the dtype's
minimum (not -inf), so fully masked rows, such as left padding, stay finite.

Shapes: B batch, T new tokens, S keys (cache length), D embed, N heads, K kv heads,
G = N / K query heads per kv head, H head dim, F mlp.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.algorithms.masked import compute_dtype
from jaxrl_llm.models.config import ModelConfig, RopeConfig, as_dtype
from jaxrl_llm.models.kv_int8 import Pool
from jaxrl_llm.models.lora import dense
from jaxrl_llm.models.paged import PagedBatch, gathered_attention, write_and_decode, write_kv
from jaxrl_llm.models.self_attention import Segments, attend, self_attend
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.rules import ShardingContext, constrain

Array = jax.Array


def make_param(rngs: nnx.Rngs, init, shape, logical_axes, dtype) -> nnx.Param:
    """A parameter carrying its logical axis names (read by `sharding.rules`)."""
    assert len(shape) == len(logical_axes), (shape, logical_axes)
    return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=tuple(logical_axes))


_normal = nnx.initializers.normal(0.02)
_zeros = nnx.initializers.zeros
_ones = nnx.initializers.ones


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, param_dtype, rngs: nnx.Rngs, axis=None):
        """`axis`: the weight's logical axis name (None: replicated; ax.HEAD_DIM for q/k)."""
        self.weight = make_param(rngs, _ones, (dim,), (axis,), param_dtype)
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        dtype = x.dtype
        x32 = x.astype(compute_dtype(x))
        var = jnp.mean(x32 * x32, axis=-1, keepdims=True)
        normed = (x32 * jax.lax.rsqrt(var + self.eps)).astype(dtype)
        return self.weight[...].astype(dtype) * normed


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> np.ndarray:
    """Inverse frequencies [H/2], including linear and Llama-3.1 ('llama3') scaling.

    llama3 (Meta's Llama 3.1 release): wavelengths longer than
    original_len / low_freq_factor are divided by `factor`, shorter than
    original_len / high_freq_factor are kept, and those between are interpolated
    smoothly in 1/wavelength.
    """
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / head_dim
    inv_freq = (1.0 / (rope.theta**exponent)).astype(np.float32)
    if rope.type == "linear":
        return (inv_freq / rope.factor).astype(np.float32)
    if rope.type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq


def rope_cos_sin(positions: Array, inv_freq: np.ndarray, dtype) -> tuple[Array, Array]:
    """cos, sin [B, T, H] for integer positions [B, T] (angles in float32, or float64 for a
    float64 model)."""
    wide = compute_dtype(dtype)
    angles = positions.astype(wide)[..., None] * jnp.asarray(inv_freq, wide)[None, None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate x [B, T, heads, H] by the half-split convention (HF `rotate_half`)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


class Attention(nnx.Module):
    """Grouped-query attention with optional q/k/v (and o) biases and a KV cache."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = as_dtype(cfg.param_dtype)
        D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = make_param(rngs, _normal, (D, N, H), (ax.EMBED, ax.HEADS, ax.HEAD_DIM), pd)
        self.k_proj = make_param(rngs, _normal, (D, K, H), (ax.EMBED, ax.KV_HEADS, ax.HEAD_DIM), pd)
        self.v_proj = make_param(rngs, _normal, (D, K, H), (ax.EMBED, ax.KV_HEADS, ax.HEAD_DIM), pd)
        self.o_proj = make_param(rngs, _normal, (N, H, D), (ax.HEADS, ax.HEAD_DIM, ax.EMBED), pd)
        if cfg.qkv_bias:
            self.q_bias = make_param(rngs, _zeros, (N, H), (ax.HEADS, ax.HEAD_DIM), pd)
            self.k_bias = make_param(rngs, _zeros, (K, H), (ax.KV_HEADS, ax.HEAD_DIM), pd)
            self.v_bias = make_param(rngs, _zeros, (K, H), (ax.KV_HEADS, ax.HEAD_DIM), pd)
        if cfg.o_bias:
            self.o_bias = make_param(rngs, _zeros, (D,), (None,), pd)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's H dims, before RoPE
            eps = cfg.rms_norm_eps
            self.q_norm = RMSNorm(H, eps, param_dtype=pd, rngs=rngs, axis=ax.HEAD_DIM)
            self.k_norm = RMSNorm(H, eps, param_dtype=pd, rngs=rngs, axis=ax.HEAD_DIM)
        self.qk_norm = cfg.qk_norm
        self.qkv_bias = cfg.qkv_bias
        self.use_o_bias = cfg.o_bias
        self.scale = cfg.head_dim**-0.5
        self.attention = cfg.attention  # full forwards' implementation (`self_attention`)

    def __call__(
        self,
        x: Array,
        cos: Array,
        sin: Array,
        mask: Array | Segments,
        kv_cache: tuple[Array, Array] | None,
        write_index: Array | None,
        ctx: ShardingContext | None,
    ) -> tuple[Array, tuple[Array, Array] | None]:
        """x [B,T,D]; kv_cache ([B,S,K,H], [B,S,K,H]) or None for a full forward, whose
        `mask` is its `Segments`; with a cache, `mask` is [B,T,S] (True = may attend).

        With a cache, the new keys/values are written at `write_index` [B,T] (indices
        >= S are dropped: padding) and attention runs over the whole cache.
        """
        q, k, v = self.project(x, cos, sin, ctx)
        if kv_cache is None:
            assert isinstance(mask, Segments), "a full forward's mask is its Segments"
            out = self_attend(q, k, v, mask, self.scale, self.attention, ctx)
            return self.output(out), None
        assert not isinstance(mask, Segments)
        cache_k, cache_v = kv_cache
        rows = jnp.arange(x.shape[0])[:, None]
        cache_k = cache_k.at[rows, write_index].set(k.astype(cache_k.dtype), mode="drop")
        cache_v = cache_v.at[rows, write_index].set(v.astype(cache_v.dtype), mode="drop")
        cache_spec = (ax.BATCH, ax.CACHE_SEQ, ax.ACT_KV_HEADS, None)
        cache_k = constrain(cache_k, cache_spec, ctx)
        cache_v = constrain(cache_v, cache_spec, ctx)
        k, v = cache_k.astype(x.dtype), cache_v.astype(x.dtype)
        return self.output(attend(q, k, v, mask, self.scale)), (cache_k, cache_v)

    def paged(
        self,
        x: Array,
        cos: Array,
        sin: Array,
        kv_pages: Pool,
        batch: PagedBatch,
        positions: Array,
        ctx: ShardingContext | None,
    ) -> tuple[Array, Pool]:
        """x [B,T,D] appended to paged sequences (`models.paged`): writes their keys/values
        into `kv_pages` [P, ps, 2K, H] and attends over the pages each row uses."""
        q, k, v = self.project(x, cos, sin, ctx)
        if x.shape[1] == 1:
            out, kv_pages = write_and_decode(
                q[:, 0], k[:, 0], v[:, 0], kv_pages, batch, ctx, sm_scale=self.scale
            )
            out = out[:, None]
        else:
            kv_pages = write_kv(kv_pages, k, v, batch.write_slots)
            out = gathered_attention(
                q, kv_pages, batch.kv_lens, batch.page_indices, positions, sm_scale=self.scale
            )
        return self.output(out), kv_pages

    def project(self, x: Array, cos: Array, sin: Array, ctx: ShardingContext | None):
        """q [B,T,N,H], k, v [B,T,K,H] with rotary embeddings applied to q and k (after the
        q/k norm when the family has one: full, cached and paged paths all come here)."""
        dtype = x.dtype
        q = dense(self, "q_proj", "btd,dnh->btnh", x, ctx)
        k = dense(self, "k_proj", "btd,dkh->btkh", x, ctx)
        v = dense(self, "v_proj", "btd,dkh->btkh", x, ctx)
        if self.qkv_bias:
            q = q + self.q_bias[...].astype(dtype)
            k = k + self.k_bias[...].astype(dtype)
            v = v + self.v_bias[...].astype(dtype)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = constrain(apply_rope(q, cos, sin), (ax.BATCH, ax.SEQ, ax.ACT_HEADS, None), ctx)
        k = constrain(apply_rope(k, cos, sin), (ax.BATCH, ax.SEQ, ax.ACT_KV_HEADS, None), ctx)
        v = constrain(v, (ax.BATCH, ax.SEQ, ax.ACT_KV_HEADS, None), ctx)
        return q, k, v

    def output(self, out: Array) -> Array:
        """Attention output [B,T,N,H] -> [B,T,D] through o_proj."""
        out = dense(self, "o_proj", "btnh,nhd->btd", out)
        if self.use_o_bias:
            out = out + self.o_bias[...].astype(out.dtype)
        return out


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = as_dtype(cfg.param_dtype)
        D, F = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = make_param(rngs, _normal, (D, F), (ax.EMBED, ax.MLP), pd)
        self.up_proj = make_param(rngs, _normal, (D, F), (ax.EMBED, ax.MLP), pd)
        self.down_proj = make_param(rngs, _normal, (F, D), (ax.MLP, ax.EMBED), pd)
        if cfg.mlp_bias:
            self.gate_bias = make_param(rngs, _zeros, (F,), (ax.MLP,), pd)
            self.up_bias = make_param(rngs, _zeros, (F,), (ax.MLP,), pd)
            self.down_bias = make_param(rngs, _zeros, (D,), (None,), pd)
        self.use_bias = cfg.mlp_bias

    def __call__(self, x: Array, ctx: ShardingContext | None) -> Array:
        dtype = x.dtype
        gate = dense(self, "gate_proj", "btd,df->btf", x, ctx)
        up = dense(self, "up_proj", "btd,df->btf", x, ctx)
        if self.use_bias:
            gate = gate + self.gate_bias[...].astype(dtype)
            up = up + self.up_bias[...].astype(dtype)
        h = constrain(jax.nn.silu(gate) * up, (ax.BATCH, ax.SEQ, ax.ACT_MLP), ctx)
        out = dense(self, "down_proj", "btf,fd->btd", h, ctx)
        if self.use_bias:
            out = out + self.down_bias[...].astype(dtype)
        return out

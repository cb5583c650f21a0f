"""Int8 weights: a frozen LoRA base (QLoRA-style, `LoraConfig.quantize_base = 'int8'`) and
the rollout sampler's copy of the policy (`RolloutConfig.weights = 'int8'`).

A weight W [in..., out...] is stored as int8 W_q with one scale per output channel,
s[out...] = max |W| over the input dims / 127 (rounded to the dtype s is stored in), W_q =
round(W / s): each element of W_q s is off by at most s / 2. Scaling commutes with the
contraction over the input dims, so the layer computes x W ~= (x W_q) * s, reading one byte
per weight element instead of two or four. (QLoRA's 4-bit NormalFloat with double
quantisation is not implemented.)

The sampler's W8A8 form (`RolloutConfig.weights = 'w8a8'`, `int8_product`) also rounds each
token's activations to int8 with one scale per token, so the product runs on int8 operands
with int32 sums; it is for sampling only (rounding has no useful gradient).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx
from jax.core import Tracer
from jax.sharding import NamedSharding, PartitionSpec

Array = jax.Array
M = TypeVar("M", bound=nnx.Module)

INT8_MAX = 127.0
# Input dims of each projection's weight (the rest are output dims), by attribute name.
PROJECTION_IN_DIMS = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1,
                      "up_proj": 1, "down_proj": 1}  # fmt: skip
SCALE_SUFFIX = "_qscale"  # `<name>_qscale` beside weight `<name>`: its per-channel scales
# The sampler also quantises the token embedding (by rows: one scale per token, which also
# serves the tied LM head's output channels) and an untied LM head [D, V] (per vocab column).
SAMPLER_WEIGHTS = {**PROJECTION_IN_DIMS, "embed_tokens": (1,), "lm_head": 1}
# A static module attribute: True where the sampler's projections also quantise their input
# (`int8_product`, W8A8); never set on a model that trains.
INT8_ACTIVATIONS = "int8_activations"
MIN_INT8_ROWS = 8


def quantize_int8(
    w: Array, in_dims: int | tuple[int, ...], scale_dtype: Any = None
) -> tuple[Array, Array]:
    """(W_q int8, s in `scale_dtype`, default W's dtype) of W, one scale per output channel:
    `in_dims` leading input dims (W [in..., out...], s [out...]), or a tuple of the axes
    reduced (an embedding [V, D] by rows: (1,), s [V]). s is rounded to its dtype before W
    is divided by it, so the pair as stored keeps the s / 2 bound (a bfloat16 s rounded
    afterwards would move W_q s by up to 127 s 2^-9 more); a rounded-down normal s puts |W| /
    s at most 127.25, which the clip to 127 keeps within the bound, and a subnormal one
    rounded that far down is stepped up."""
    axes = tuple(range(in_dims)) if isinstance(in_dims, int) else in_dims
    w32 = w.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(w32), axis=axes, keepdims=True)
    dtype = w.dtype if scale_dtype is None else scale_dtype
    scale = jnp.where(absmax > 0, absmax / INT8_MAX, 1.0).astype(dtype)
    # A scale below its dtype's normal range (float16 under 6.1e-5: channels of absmax under
    # 7.8e-3) is stored to a fixed absolute step and may round far down, putting |W| / s past
    # 127.5, where the clip would cut the channel's largest weights: one step up puts it at
    # 127 or under (round to nearest is off by at most half a step). Never taken for a
    # normal scale (|W| / s <= 127.25 there).
    cut = absmax / scale.astype(jnp.float32) > INT8_MAX + 0.5
    scale = jnp.where(cut, jnp.nextafter(scale, jnp.asarray(jnp.inf, scale.dtype)), scale)
    s32 = scale.astype(jnp.float32)
    s32 = jnp.where(s32 > 0, s32, 1.0)  # still 0 (subnormals flushed): W_q s = 0, no NaN
    q = jnp.clip(jnp.round(w32 / s32), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return q, jnp.squeeze(scale, axes)


def dequantize(q: Array, scale: Array) -> Array:
    """W_q * s in s's dtype (s broadcasts over the leading input dims)."""
    return (q.astype(jnp.float32) * scale.astype(jnp.float32)).astype(scale.dtype)


_quantize_jit = jax.jit(quantize_int8, static_argnums=1)


def _kept(seq: tuple, in_dims: int | tuple[int, ...]) -> tuple:
    """The entries of `seq` (one per weight dim) on the dims a scale keeps."""
    axes = tuple(range(in_dims)) if isinstance(in_dims, int) else in_dims
    return tuple(x for i, x in enumerate(seq) if i not in axes)


def quantize_variable(weight: nnx.Param, in_dims: int | tuple[int, ...]) -> nnx.Param:
    """Store `weight` as int8 in place and return its per-output-channel scales as a Param.

    Both keep the float weight's layout: the int8 array its sharding, the scales the
    sharding of its output dims (logical axes likewise). Used by `lora.apply_lora` on a
    loaded model and by `hf_io.from_pretrained(quantize=...)` on each weight as it is read,
    so a model whose float weights do not fit never holds them all at once.
    """
    w = weight.get_value()
    axes = tuple(weight.get_metadata()["logical_axes"])
    q, scale = _quantize_jit(w, in_dims)
    sharding = getattr(w, "sharding", None)
    if isinstance(sharding, NamedSharding) and not isinstance(q, Tracer):
        q = jax.device_put(q, sharding)
        spec = tuple(sharding.spec) + (None,) * (w.ndim - len(sharding.spec))
        scale = jax.device_put(
            scale, NamedSharding(sharding.mesh, PartitionSpec(*_kept(spec, in_dims)))
        )
    weight.set_value(q)
    return nnx.Param(scale, logical_axes=_kept(axes, in_dims))


def _sampler_in_dims(name: Any, value: Any, scaled: bool) -> int | tuple[int, ...] | None:
    """The reduced dims of the weight `name` if the sampler stores it as int8 and it is still
    float (`scaled`: its scales already exist, as on an int8 LoRA base), else None. The one
    rule for modules (`int8_projections`) and States (`quantize_projections`)."""
    in_dims = SAMPLER_WEIGHTS.get(name) if isinstance(name, str) else None
    if in_dims is None or scaled or not jnp.issubdtype(value.dtype, jnp.floating):
        return None
    return in_dims


def int8_product(spec: str, x: Array, q: Array, scale: Array, in_dims: int) -> Array:
    """einsum(spec, x, W) for W = q * scale (int8, per output channel) with x quantised per
    token: s_x = max |x| over its last `in_dims` (contracted) dims / 127, x_q = round(x /
    s_x), y = (x_q q, accumulated exactly in int32) * s_x * scale. Both operands are read as
    int8 (XLA:CPU runs such a dot several times faster than a float one of the same shape;
    a weight-only int8 product there first writes the whole weight back as float). Each
    element of x is off by at most s_x / 2, on top of the weight's own rounding."""
    x32 = x.astype(jnp.float32)
    lead = x.ndim - in_dims
    absmax = jnp.max(jnp.abs(x32), axis=tuple(range(lead, x.ndim)), keepdims=True)
    sx = jnp.where(absmax > 0, absmax / INT8_MAX, 1.0)
    xq = jnp.clip(jnp.round(x32 / sx), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    # Fewer than 8 rows (decoding 1-7 slots): padded to 8. XLA:CPU's int8 dot with one row
    # takes a matrix-vector path 6x slower than with 8 (0.5B MLP shape: 1.5 ms vs 0.25 ms).
    rows, pad = math.prod(x.shape[:lead]), 0
    if rows < MIN_INT8_ROWS:
        per_row = rows // x.shape[0]
        pad = -(-MIN_INT8_ROWS // per_row) - x.shape[0]
        xq = jnp.pad(xq, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    y = jnp.einsum(spec, xq, q, preferred_element_type=jnp.int32).astype(jnp.float32)
    y = y[: x.shape[0]] if pad else y
    sx = sx.reshape(x.shape[:lead] + (1,) * (y.ndim - lead))
    return (y * sx * scale.astype(jnp.float32)).astype(x.dtype)


def int8_projections(model: M, *, activations: bool = False) -> M:
    """Store every float projection weight of `model` (`PROJECTION_IN_DIMS`), the token
    embedding and an untied LM head as int8 with per-output-channel scales beside them
    (`<name>_qscale`; the embedding's per row), in place; the layers then compute (x W_q) * s
    (`lora.dense`, `CausalLM.logits`), or with `activations` `int8_product` (W8A8: the
    sampler only; it has no gradient). Norms and biases stay as they are. Works on a
    concrete model and, under `nnx.eval_shape`, on an abstract one. Returns `model`."""
    for path, module in nnx.iter_modules(model):
        if activations and (not path or any(hasattr(module, n) for n in SAMPLER_WEIGHTS)):
            setattr(module, INT8_ACTIVATIONS, True)  # the root: its LM head (`logits`)
        for name in SAMPLER_WEIGHTS:
            w = getattr(module, name, None)
            if not isinstance(w, nnx.Param) or isinstance(w, nnx.LoRAParam):
                continue
            scaled = getattr(module, name + SCALE_SUFFIX, None) is not None
            in_dims = _sampler_in_dims(name, w.get_value(), scaled)
            if in_dims is not None:
                setattr(module, name + SCALE_SUFFIX, quantize_variable(w, in_dims))
    return model


def int8_sampler_model(policy: M, *, activations: bool = False) -> M:
    """An abstract copy of `policy` (shapes only, nothing allocated) with its projections
    int8 (`int8_projections`): the architecture the sampler's engine compiles for."""
    return nnx.eval_shape(lambda m: int8_projections(nnx.clone(m), activations=activations), policy)


def quantize_projections(state: nnx.State, scale_dtype: Any = None) -> nnx.State:
    """`state` (a policy's float State) with every projection weight int8 and its scales
    (in `scale_dtype`, default the weight's) added, the tree
    `nnx.state(int8_sampler_model(policy))` has; jittable (the sampler's weight sync runs it
    once per update). Weights already int8 (an int8 LoRA base) and everything else pass
    through."""
    flat = dict(nnx.to_flat_state(state))
    out = {}
    for path, var in flat.items():
        value = var.get_value()
        scaled = (*path[:-1], f"{path[-1]}{SCALE_SUFFIX}") in flat
        in_dims = _sampler_in_dims(path[-1], value, scaled)
        if in_dims is None:
            out[path] = var
            continue
        q, scale = quantize_int8(value, in_dims, scale_dtype)
        axes = tuple(var.get_metadata()["logical_axes"])
        out[path] = var.replace(q)
        scale_path = (*path[:-1], f"{path[-1]}{SCALE_SUFFIX}")
        out[scale_path] = nnx.Param(scale, logical_axes=_kept(axes, in_dims))
    return nnx.from_flat_state(out)

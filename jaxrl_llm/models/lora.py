"""Low-rank adapters (LoRA, Hu et al. 2021) on the projections of a frozen model.

A targeted weight W [in..., out...] gets A [in..., r] and B [r, out...] (`nnx.LoRAParam`,
stored on the module beside W as `<name>_lora_a` / `<name>_lora_b`); the layer computes
    y = x W + (alpha / r) * (x A) B
so the merged weight is W + (alpha / r) A B. A starts as PEFT's (uniform in +-1/sqrt(fan_in),
fan_in = prod(in)), B at zero: the adapted model starts equal to the base. Each adapter dim
keeps its base dim's logical axis name (the rank axis has none), so `sharding.rules` lays
adapters out like their weights. Shapes: q/k/v [D, r] x [r, heads, H]; o [N, H, r] x [r, D];
gate/up [D, r] x [r, F]; down [F, r] x [r, D].

Why not qwix (Google's LoRA library, used by Tunix): for an NNX model it intercepts one
method only (`quantize_nnx_model(call_method=...)`) by patching `jnp.einsum`/`dot_general`
while that method runs; this model is driven through `hidden_states` + `logits` in training
and `extend_paged` in the rollout engine, so adapters would be missing from all but one of
them, and turning them off for the reference forward would mean swapping the module class.
Here the layers add the adapter term themselves (`dense`), on every path.

No LoRA dropout: the PPO ratio compares this network with itself, and a dropout mask in the
trainer's forward (absent from the rollout's) would make the ratio noisy and the on-policy
shortcut (`steps.exactly_on_policy`) wrong.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import gin
import jax
import jax.numpy as jnp
from flax import nnx
from jax.core import Tracer
from jax.sharding import Mesh, NamedSharding

from jaxrl_llm.config_checks import ConfigError, Ge, Gt, checked_fields, documented
from jaxrl_llm.models.int8_cpu import int8_matmul
from jaxrl_llm.models.quant import (
    INT8_ACTIVATIONS,
    PROJECTION_IN_DIMS,
    SCALE_SUFFIX,
    dequantize,
    int8_product,
    quantize_variable,
)
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.rules import (
    TRAIN_RULES,
    Rules,
    ShardingContext,
    constrain,
    logical_sharding,
)

Array = jax.Array
M = TypeVar("M", bound=nnx.Module)

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_IN_DIMS = PROJECTION_IN_DIMS  # input dims of each projection's weight (the rest: output)
_SUFFIXES = ("_lora_a", "_lora_b")


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(rank=Ge(1), alpha=Gt(0), quantize_base=("none", "int8"))
class LoraConfig:
    """Adapters of rank `rank` scaled by alpha / rank on the weights `targets` names: a
    projection name (`q_proj`, matched in every layer, as PEFT's `target_modules`) or a
    regular expression over the weight's path (`model/layers/0/self_attn/q_proj`).
    `quantize_base = 'int8'`: the adapted (frozen) weights are stored as int8 with one
    scale per output channel (`models.quant`)."""

    rank: int = documented(16, "Rank r of each adapter (A is [in, r], B is [r, out]).")
    alpha: float = documented(32.0, "Scale of the adapter term: the update is (alpha / rank) A B.")
    targets: tuple[str, ...] = documented(
        ALL_PROJECTIONS,
        "Weights that get an adapter: projection names (matched in every layer) or regular "
        "expressions over weight paths such as 'model/layers/0/self_attn/q_proj'.",
    )
    quantize_base: str = documented(
        "none", "'int8': store the frozen adapted weights as int8, one scale per output channel."
    )

    def __post_init__(self):
        if not self.targets:
            raise ConfigError("LoraConfig.targets = (): expected at least one projection name")
        for t in self.targets:
            try:
                re.compile(t)
            except re.error as e:
                raise ConfigError(
                    f"LoraConfig.targets: {t!r} is not a regular expression: {e}"
                ) from e

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _matches(cfg: LoraConfig, path: str, name: str) -> bool:
    return any(_matches_one(t, path, name) for t in cfg.targets)


def _matches_one(target: str, path: str, name: str) -> bool:
    """Target `target` selects weight `name` at `path`: by name, or by the whole path."""
    return target == name or re.fullmatch(target, path) is not None


def apply_lora(model: nnx.Module, cfg: LoraConfig, *, seed: int, rules: Rules = TRAIN_RULES) -> int:
    """Attach adapters to every weight `cfg.targets` selects (in place); returns how many
    weights got one. Each adapter is placed like its weight (same mesh, `rules`). A target
    that matches no weight is refused (a `ConfigError` naming it)."""
    candidates: dict[str, tuple[Any, str]] = {p: (m, n) for m, n, p in projection_weights(model)}
    chosen = [(*candidates[path], path) for path in adapted_weights(cfg, candidates)]
    _check_same_in_every_layer(model, cfg, [p for _, _, p in chosen])
    rng = jax.random.key(seed)
    for module, name, _ in chosen:
        rng, key = jax.random.split(rng)
        base = getattr(module, name)
        qscale = getattr(module, name + "_qscale", None)  # quantised as it was loaded
        dtype = (base if qscale is None else qscale).get_value().dtype  # the float dtype
        a, b = _new_adapter(base, name, cfg.rank, key, rules, dtype)
        setattr(module, name + "_lora_a", a)
        setattr(module, name + "_lora_b", b)
        module.lora_scale = cfg.scale
        if cfg.quantize_base == "int8":
            _quantize_weight(module, name, base)
    return len(chosen)


def _quantize_weight(module: nnx.Module, name: str, base: nnx.Param) -> None:
    """Store weight `name` as int8 + per-output-channel scale (`<name>_qscale`), each laid
    out by its logical axes (the int8 weight where the float one was). A weight that
    `from_pretrained(quantize=int8_weights(cfg))` already quantised is left as it is."""
    if getattr(module, name + "_qscale", None) is None:
        setattr(module, name + "_qscale", quantize_variable(base, _IN_DIMS[name]))


def int8_weights(cfg: LoraConfig | None) -> Callable[[str], int | None] | None:
    """For `hf_io.from_pretrained(quantize=...)`: of a '/'-joined weight path, its input
    dims when `apply_lora(cfg)` would store it as int8, else None; None without an int8
    base. Quantising as the checkpoint is read keeps the float weights from ever being
    resident together (a 7B bf16 base is 15.2 GB, its int8 form 9.0 GB)."""
    if cfg is None or cfg.quantize_base != "int8":
        return None

    def select(path: str) -> int | None:
        name = _adapted_name(cfg, path)
        return None if name is None else _IN_DIMS[name]

    return select


def _check_same_in_every_layer(model: nnx.Module, cfg: LoraConfig, paths: list[str]) -> None:
    """A scanned decoder (`ModelConfig.scan_layers`) stacks the layers' states, so every
    layer must carry the same adapters."""
    config = getattr(model, "config", None)
    if config is None or not getattr(config, "scan_layers", False):
        return
    per_layer: dict[str, set[str]] = {}
    for path in paths:
        match = re.match(r".*layers/(\d+)/(.*)", path)
        if match:
            per_layer.setdefault(match[1], set()).add(match[2])
    layers = {str(i) for i in range(config.num_layers)}
    if set(per_layer) != layers or len({frozenset(v) for v in per_layer.values()}) > 1:
        raise ConfigError(
            f"LoraConfig.targets = {cfg.targets} adapts different weights in different "
            "layers, but ModelConfig.scan_layers = True stacks the layers: target the same "
            "projections in every layer (names such as 'q_proj'), or turn scan_layers off"
        )


def adapter_specs(name: str, shape: tuple[int, ...], axes: tuple, rank: int) -> tuple:
    """((A shape, A logical axes), (B shape, B logical axes)) of weight `name`'s adapter."""
    n = _IN_DIMS[name]
    return ((*shape[:n], rank), (*axes[:n], None)), ((rank, *shape[n:]), (None, *axes[n:]))


def adapted_weights(cfg: LoraConfig, paths: Any) -> list[str]:
    """Of '/'-joined parameter paths, those `cfg.targets` gives an adapter (`apply_lora`'s
    choice, also the planner's on its shapes-only model). A `ConfigError` names each target
    that matches none of them: a typo beside a valid target would otherwise train fewer
    weights than asked, unnoticed."""
    paths = list(paths)
    projections = [(path, path.rsplit("/", 1)[-1]) for path in paths]
    projections = [(path, name) for path, name in projections if name in _IN_DIMS]
    unmatched = [t for t in cfg.targets if not any(_matches_one(t, *p) for p in projections)]
    if unmatched:
        example = next(
            (p for p, n in projections if n == "q_proj"), "model/layers/0/self_attn/q_proj"
        )
        raise ConfigError(
            f"LoraConfig.targets = {cfg.targets}: no weight matched "
            f"{', '.join(map(repr, unmatched))}; expected projection names among "
            f"{ALL_PROJECTIONS} or regular expressions over whole weight paths such as "
            f"{example!r}; fix or remove {'it' if len(unmatched) == 1 else 'them'}"
        )
    return [path for path in paths if _adapted_name(cfg, path) is not None]


def projection_weights(model: nnx.Module) -> Iterator[tuple[nnx.Module, str, str]]:
    """(module, name, '/'-joined path) of each projection weight of `model` that can take
    an adapter (an `nnx.Param` named in `_IN_DIMS`)."""
    for path, module in nnx.iter_modules(model):
        prefix = "/".join(map(str, path))
        for name in _IN_DIMS:
            base = getattr(module, name, None)
            if isinstance(base, nnx.Param) and not isinstance(base, nnx.LoRAParam):
                yield module, name, f"{prefix}/{name}"


def _adapted_name(cfg: LoraConfig, path: str) -> str | None:
    """The projection name of a '/'-joined weight path that `cfg.targets` adapts, or None."""
    name = path.rsplit("/", 1)[-1]
    return name if name in _IN_DIMS and _matches(cfg, path, name) else None


def _new_adapter(base: nnx.Param, name: str, rank: int, key, rules: Rules, dtype):
    shape, axes = base.shape, tuple(base.get_metadata()["logical_axes"])
    (a_shape, a_axes), (b_shape, b_axes) = adapter_specs(name, shape, axes, rank)
    bound = 1.0 / math.sqrt(math.prod(shape[: _IN_DIMS[name]]))
    a = jax.random.uniform(key, a_shape, jnp.float32, -bound, bound).astype(dtype)
    b = jnp.zeros(b_shape, dtype)
    # Under `nnx.eval_shape` (the planner) values are tracers: nothing to place.
    sharding = getattr(base.get_value(), "sharding", None)
    mesh = sharding.mesh if isinstance(sharding, NamedSharding) else None
    if isinstance(mesh, Mesh) and not isinstance(a, Tracer):
        a = jax.device_put(a, logical_sharding(a_axes, rules, mesh, a_shape))
        b = jax.device_put(b, logical_sharding(b_axes, rules, mesh, b_shape))
    return nnx.LoRAParam(a, logical_axes=a_axes), nnx.LoRAParam(b, logical_axes=b_axes)


def dense(
    module: nnx.Module, name: str, spec: str, x: Array, ctx: ShardingContext | None = None
) -> Array:
    """x times the module's weight `name` by einsum `spec` (x [B, T, in...] -> y [B, T,
    out...]), plus the adapter term (alpha / r) (x A) B when it has one: every projection's
    product is formed here. An int8 weight (`models.quant`) is scaled per output channel
    after the product; on a module marked `int8_activations` (the W8A8 sampler) x is
    quantised per token as well (`quant.int8_product`). With `ctx`, x A [B, T, r] is kept
    split by rows only: XLA then gathers the small A rather than re-laying out the
    activations to match A's fsdp-split input dim."""
    w = getattr(module, name)[...]
    qscale = getattr(module, name + SCALE_SUFFIX, None)
    xf, k = x, _IN_DIMS[name]
    if k > 1:  # one contracted dim (see `_flat_contraction`)
        spec, xf, w = _flat_contraction(spec, x, w, k)
    spec, xf, rows = _flat_rows(spec, xf)
    if qscale is not None and vars(module).get(INT8_ACTIVATIONS, False):
        y = int8_product(spec, xf, w, qscale[...], 1)
    elif qscale is not None:  # y = x W_q of an int8 weight, its output channels scaled
        y = _int8_weight_product(spec, xf, w, qscale[...])
    else:
        y = jnp.einsum(spec, xf, w.astype(x.dtype))
    y = y.reshape(*rows, *y.shape[1:]) if rows else y
    a = getattr(module, name + "_lora_a", None)
    if a is None:
        return y
    b = getattr(module, name + "_lora_b")
    xa = jnp.tensordot(x, a[...].astype(x.dtype), axes=a.ndim - 1)  # [B, T, r]
    xa = constrain(xa, (ax.BATCH, ax.SEQ, None), ctx)
    delta = jnp.tensordot(xa, b[...].astype(x.dtype), axes=1)
    return y + (_scale(module) * delta).astype(y.dtype)


def _int8_weight_product(spec: str, x: Array, q: Array, scale: Array) -> Array:
    """einsum(spec, x, q) * scale for an int8 weight q [K, out...] and x [R, K]: on a CPU
    with few rows by `int8_cpu.int8_matmul`'s kernel (q read as int8, out dims as one),
    else by XLA (q converted to x's dtype, then the dot)."""

    def xla(x: Array, q: Array, scale: Array) -> Array:
        y = jnp.einsum(spec, x, q.astype(x.dtype))
        return y * scale.astype(y.dtype)

    lhs, rest = spec.split(",")
    rhs, out = rest.split("->")
    if x.ndim != 2 or rhs[0] != lhs[1] or out != lhs[0] + rhs[1:]:
        return xla(x, q, scale)
    outs = q.shape[1:]

    def flat_xla(x: Array, q2: Array, s2: Array) -> Array:  # xla on the flattened operands
        return xla(x, q2.reshape(q.shape), s2.reshape(outs)).reshape(x.shape[0], -1)

    y = int8_matmul(x, q.reshape(q.shape[0], -1), scale.reshape(-1), flat_xla)
    return y.reshape(x.shape[0], *outs)


def _flat_contraction(spec: str, x: Array, w: Array, k: int) -> tuple[str, Array, Array]:
    """`spec`, x and w with the k contracted dims (x's last k, w's first k) merged into one,
    a free reshape of both row-major arrays. Contracting o_proj's [N, H, D] over two dims let
    XLA:CPU lay the product out by transposing the whole weight in every decode step (a
    copy of N x H x D floats per layer and step, 27% of a 0.5B-shape decode step)."""
    lhs, rest = spec.split(",")
    rhs, out = rest.split("->")
    assert lhs[-k:] == rhs[:k], spec
    z = next(c for c in "zyxwvu" if c not in spec)
    flat = f"{lhs[:-k]}{z},{z}{rhs[k:]}->{out}"
    return flat, x.reshape(*x.shape[:-k], -1), w.reshape(-1, *w.shape[k:])


def _flat_rows(spec: str, x: Array) -> tuple[str, Array, tuple[int, ...]]:
    """`spec` and x [B, T, in...] with the two row dims merged into one ([B * T, in...], a
    free reshape), and (B, T) to split the product's rows back (empty when x has no such
    rows). Over two row dims XLA:CPU forms the backward's weight gradients from transposed
    [out, B, T] copies of the activation gradients (in the 0.5B-shape step on an AMD EPYC,
    the MLP's SwiGLU backward fused with such a copy took 25-62 ms a layer); over one row dim
    it needs none: the 0.5B MLP's forward and backward alone took 206-213 ms instead of
    252-269 ms, with bit-identical gradients (docs/performance.md)."""
    lhs, rest = spec.split(",")
    rhs, out = rest.split("->")
    if len(lhs) < 3 or lhs[:2] != out[:2] or set(lhs[:2]) & set(rhs):
        return spec, x, x.shape[:0]
    r = next(c for c in "rqponm" if c not in spec)
    return f"{r}{lhs[2:]},{rhs}->{r}{out[2:]}", x.reshape(-1, *x.shape[2:]), x.shape[:2]


def _scale(module: nnx.Module) -> float:
    """alpha / r, set by `apply_lora` on each module it adapts (a static attribute)."""
    return vars(module)["lora_scale"]


def is_adapter(path: tuple, _value: Any = None) -> bool:
    """An nnx filter: True for adapter leaves (works on States of Variables or of plain
    values, e.g. the engine's sharding tree)."""
    return str(path[-1]).endswith(_SUFFIXES)


def split_adapters(state: nnx.State) -> tuple[nnx.State, nnx.State]:
    """(adapters, everything else) of a model's State."""
    adapters, rest = nnx.split_state(state, is_adapter, ...)
    return adapters, rest


def has_adapters(model_or_state: Any) -> bool:
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state)
    return any(is_adapter(path) for path, _ in nnx.to_flat_state(state))


def adapters_off(adapters: nnx.State) -> nnx.State:
    """Zero adapters (B = 0 gives exactly the base's outputs): with the frozen base, the
    reference policy without a second copy of the weights."""
    return jax.tree.map(jnp.zeros_like, adapters)


def state_bytes(state: Any) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(state))


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One adapted weight: the module holding it, the weight's name, its path ('/'-joined)."""

    module: nnx.Module
    name: str
    path: str

    @property
    def a(self) -> Array:
        return getattr(self.module, self.name + "_lora_a")[...]

    @property
    def b(self) -> Array:
        return getattr(self.module, self.name + "_lora_b")[...]

    @property
    def scale(self) -> float:
        return _scale(self.module)

    def delta(self) -> Array:
        """(alpha / r) A B in the base weight's shape, float32."""
        a, b = self.a.astype(jnp.float32), self.b.astype(jnp.float32)
        return self.scale * jnp.tensordot(a, b, axes=1)


def adapters(model: nnx.Module) -> Iterator[Adapter]:
    for path, module in nnx.iter_modules(model):
        for name in _IN_DIMS:
            if hasattr(module, name + "_lora_a"):
                yield Adapter(module, name, "/".join(map(str, (*path, name))))


def merge_adapters(model: M) -> M:
    """A plain copy of `model` (`save_pretrained` writes it): every adapter folded into its
    weight (W + (alpha / r) A B) and dropped. `model` and its Variables are left as they
    are: States may share them (a push's `full_params(params, frozen)` holds the trainer's
    frozen base and KL reference). The copy has new Variables over the same arrays, and new
    arrays for the merged weights only."""
    model = nnx.clone(model)
    for ad in list(adapters(model)):
        base = getattr(ad.module, ad.name)
        w = base.get_value()
        qscale = getattr(ad.module, ad.name + "_qscale", None)
        if qscale is not None:  # an int8 base: dequantised, in the scales' (float) dtype
            w = dequantize(w, qscale.get_value())
            delattr(ad.module, ad.name + "_qscale")
        base.set_value((w.astype(jnp.float32) + ad.delta()).astype(w.dtype))
        delattr(ad.module, ad.name + "_lora_a")
        delattr(ad.module, ad.name + "_lora_b")
    for _, module in nnx.iter_modules(model):
        if hasattr(module, "lora_scale"):
            delattr(module, "lora_scale")
    return model


def has_int8_base(model: nnx.Module) -> bool:
    """Whether an adapted weight of `model` is stored as int8 (`quantize_base='int8'`)."""
    return any(hasattr(ad.module, ad.name + SCALE_SUFFIX) for ad in adapters(model))


def on_float_weights(model: M, float_model: nnx.Module) -> M:
    """A copy of `model` (new Variables over the same arrays, as `merge_adapters` makes)
    whose int8 weights are `float_model`'s at the same paths, their scales dropped: the
    adapters as trained, on the original float weights. That is what an int8 run exports
    (QLoRA's adapters are applied so: PEFT puts them on the float base), not the int8
    rounding, which is up to half a step of max|W| / 127 per output channel off."""
    model = nnx.clone(model)
    floats = dict(nnx.iter_modules(float_model))
    for path, module in nnx.iter_modules(model):
        for name in _IN_DIMS:
            if getattr(module, name + SCALE_SUFFIX, None) is not None:
                getattr(module, name).set_value(getattr(floats[path], name).get_value())
                delattr(module, name + SCALE_SUFFIX)
    return model

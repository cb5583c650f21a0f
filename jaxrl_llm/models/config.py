"""Model configuration: one frozen dataclass for the Qwen2/Qwen2.5, Qwen3 (dense) and
Llama-3 families.

`ModelConfig.from_hf(dict)` reads a Hugging Face `config.json` (both the transformers 4.x
keys `rope_theta`/`rope_scaling` and the 5.x `rope_parameters` dict) and `to_hf()` writes one
that `transformers.AutoConfig` reads back. Anything we do not implement raises
`UnsupportedModelError` naming the field, rather than silently computing something else.

Family differences carried as flags (`FAMILY_FLAGS`): Qwen2 has q/k/v biases; Qwen3 has none
(or, with `attention_bias`, q/k/v/o ones) but normalises each head's queries and keys (RMSNorm
over H, before RoPE: `qk_norm`) and may have `head_dim != hidden_size / num_heads`; Llama has
optional attention (q/k/v/o together) and MLP biases. A flag left unset takes its family's
value; one the family's Hugging Face architecture cannot have is refused.

Stopping: `eos_token_id` is `config.json`'s value (written back unchanged); `stop_token_ids`
holds the further ids that end a sample (`generation_config.json`'s `eos_token_id` and the
chat template's end-of-turn token, read by `hf_files`), and `eos_token_ids` is their union.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.config_checks import ConfigError, Ge, Gt, checked_fields

SUPPORTED_ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
ATTENTION_IMPLS = ("auto", "xla", "splash")  # `ModelConfig.attention`
# Per family, what each flag must be in Hugging Face's architecture: a bool, "qkv_bias" (one
# `attention_bias` sets q/k/v and o alike), or None (free; unset: False).
FAMILY_FLAGS: dict[str, dict[str, bool | str | None]] = {
    "qwen2": dict(qkv_bias=True, o_bias=False, mlp_bias=False, qk_norm=False),
    "qwen3": dict(qkv_bias=None, o_bias="qkv_bias", mlp_bias=False, qk_norm=True),
    "llama": dict(qkv_bias=None, o_bias="qkv_bias", mlp_bias=None, qk_norm=False),
}
# The config.json key of each flag a family may leave free (`FAMILY_FLAGS` None).
_HF_FLAG_KEYS = (("qkv_bias", "attention_bias"), ("mlp_bias", "mlp_bias"))
# A config.json without max_position_embeddings: each family's transformers default (its
# config class's), which llama3 rope's pretraining length also falls back to.
_HF_MAX_POSITIONS = {"qwen2": 32768, "qwen3": 32768, "llama": 2048}
# rope_type -> the keys transformers' validation requires of its dict (beyond the type);
# llama3's original_max_position_embeddings defaults to max_position_embeddings there.
_REQUIRED_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}


class UnsupportedModelError(ConfigError):
    """The checkpoint asks for an architecture or option this package does not implement."""


class CheckpointError(ConfigError):
    """A checkpoint is missing, incomplete, corrupt, or does not fit the config.

    A `ConfigError`: the command line ends with its message (exit 2), not a traceback.
    """


_DTYPES = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
    "float64": jnp.float64,  # reference runs only (tests' tolerances), under jax.enable_x64
}


def as_dtype(dtype: Any) -> jnp.dtype:
    """'float32' | 'bfloat16' | ... | a jnp dtype -> jnp dtype, with a clear error otherwise.

    float64 needs JAX's 64-bit mode (`with jax.enable_x64(True):`); without it JAX would
    silently compute in float32, so it is refused."""
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
        dtype = _DTYPES[dtype]
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64 and jax.dtypes.canonicalize_dtype(jnp.float64) != jnp.float64:
        raise ValueError("dtype float64 needs JAX's 64-bit mode: run under jax.enable_x64(True)")
    return dtype


@dataclasses.dataclass(frozen=True)
@checked_fields(theta=Gt(0), factor=Gt(0))
class RopeConfig:
    """Rotary embedding parameters (HF `rope_parameters` / `rope_scaling`)."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
@checked_fields(
    vocab_size=Ge(1),
    hidden_size=Ge(1),
    intermediate_size=Ge(1),
    num_layers=Ge(1),
    num_heads=Ge(1),
    num_kv_heads=Ge(1),
    head_dim=Ge(1),
    rms_norm_eps=Gt(0),
)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer.

    Shape legend: D = hidden_size, N = num_heads, K = num_kv_heads, H = head_dim,
    F = intermediate_size, V = vocab_size, L = num_layers.
    """

    model_type: str = "qwen2"
    vocab_size: int = 128
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
    # Family flags (`FAMILY_FLAGS`); None: the family's value, set by `__post_init__`.
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    mlp_bias: bool | None = None
    qk_norm: bool | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    # Further ids that end a sample (generation_config.json, the chat template's end of turn).
    stop_token_ids: tuple[int, ...] = ()
    # The source folder's generation_config.json as read ("": none), written back by
    # `generation_to_hf`; not part of the model (left out of ==, the hash and the repr).
    generation_config: str = dataclasses.field(default="", compare=False, repr=False)
    # Numerics, not part of the checkpoint: parameter storage and activation dtypes.
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: bool = False
    # Uncached forwards (training, scoring) run the layers as one `lax.scan` (compile time
    # independent of depth); cached decoding always runs them unrolled.
    scan_layers: bool = False
    # Full forwards' attention (`models.self_attention`): "auto" (Pallas splash on a TPU that
    # supports the shape, else XLA), "xla" or "splash" (Pallas interpret mode off TPU).
    attention: str = "auto"

    def __post_init__(self):
        if self.model_type not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"model_type {self.model_type!r} is not supported; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        self._resolve_family_flags()
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.rope.type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {self.rope.type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
            )
        as_dtype(self.param_dtype)
        as_dtype(self.dtype)
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(
                f"ModelConfig.attention = {self.attention!r}; expected one of {ATTENTION_IMPLS}"
            )

    def _resolve_family_flags(self) -> None:
        """Unset flags take the family's value; a set one the family cannot have is refused
        (transformers would build another model from what `to_hf` writes)."""
        arch = SUPPORTED_ARCHITECTURES[self.model_type]
        for flag, rule in FAMILY_FLAGS[self.model_type].items():
            need = getattr(self, rule) if isinstance(rule, str) else rule
            value = getattr(self, flag)
            if value is None:
                object.__setattr__(self, flag, bool(need))
            elif need is not None and value != need:
                why = f"= qkv_bias ({need})" if isinstance(rule, str) else f"= {need}"
                raise UnsupportedModelError(
                    f"ModelConfig.{flag} = {value} does not fit model_type {self.model_type!r}: "
                    f"{arch} has {flag} {why}; leave {flag} unset for the family's value"
                )

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a sample: config.json's eos first, then `stop_token_ids`."""
        return merge_token_ids(self.eos_token_id, self.stop_token_ids)

    # ---- Hugging Face config.json ----
    @classmethod
    def from_hf(
        cls, hf: dict[str, Any], *, source: str = "config.json", **overrides: Any
    ) -> ModelConfig:
        """The config of HF `config.json` dict `hf`; `source`: the file, named when a field
        the shape needs is missing."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_ARCHITECTURES:
            archs = hf.get("architectures") or [model_type]
            raise UnsupportedModelError(
                f"architecture {archs[0]!r} (model_type {model_type!r}) is not supported; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES.values())}"
            )
        if hf.get("use_sliding_window", False):
            raise UnsupportedModelError("use_sliding_window=true is not supported")
        if model_type == "llama" and hf.get("pretraining_tp", 1) != 1:
            raise UnsupportedModelError("pretraining_tp != 1 is not supported")
        for key in _REQUIRED_HF_KEYS:
            if key not in hf:
                raise CheckpointError(
                    f"{source!r} has no {key!r}, which the model's shape needs: not a complete "
                    "Hugging Face config; restore the field (the model's own config.json has it)"
                )
        hidden = hf["hidden_size"]
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hidden // heads
        # The flags a family leaves free are read from config.json; the rest follow it.
        free = FAMILY_FLAGS[model_type]
        flags = {f: bool(hf.get(key, False)) for f, key in _HF_FLAG_KEYS if free[f] is None}
        max_positions = int(hf.get("max_position_embeddings", _HF_MAX_POSITIONS[model_type]))
        kwargs: dict[str, Any] = dict(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hidden,
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope=_rope_from_hf(hf, source, max_positions),
            **flags,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=max_positions,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
        )
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only 'silu')")
        kwargs.update(overrides)
        return cls(**kwargs)

    def generation_to_hf(self) -> dict[str, Any] | None:
        """The generation_config.json to write: the source's (`generation_config`; its
        sampling defaults, which transformers' `generate` uses, kept) with every id that ends a
        sample (`eos_token_ids`) and, unless it has one, the pad id merged in. None: the source
        had none and no id beyond config.json's eos ends a sample."""
        out = json.loads(self.generation_config) if self.generation_config else {}
        if self.stop_token_ids:  # where transformers' generate (and our loader) read them
            out["eos_token_id"] = list(self.eos_token_ids)
        elif not out:
            return None
        if self.pad_token_id is not None:
            out.setdefault("pad_token_id", self.pad_token_id)
        return out

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers 4.4x and 5.x both read."""
        rope_scaling = None
        if self.rope.type == "linear":
            rope_scaling = {"rope_type": "linear", "factor": self.rope.factor}
        elif self.rope.type == "llama3":
            rope_scaling = {
                "rope_type": "llama3",
                "factor": self.rope.factor,
                "low_freq_factor": self.rope.low_freq_factor,
                "high_freq_factor": self.rope.high_freq_factor,
                "original_max_position_embeddings": self.rope.original_max_position_embeddings,
            }
        out: dict[str, Any] = {
            "architectures": [SUPPORTED_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope.theta,
            "rope_scaling": rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": self.param_dtype,
        }
        if self.model_type == "llama":
            out["attention_bias"] = self.qkv_bias
            out["mlp_bias"] = self.mlp_bias
        else:
            out["use_sliding_window"] = False
        if self.model_type == "qwen3":
            out["attention_bias"] = self.qkv_bias
        return out


# config.json keys `from_hf` cannot do without (the shape); the rest have defaults.
_REQUIRED_HF_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
)  # fmt: skip


def merge_token_ids(*groups: int | list[int] | tuple[int, ...] | None) -> tuple[int, ...]:
    """Ids from each group (an int, a list, or None) in order, each once."""
    out: list[int] = []
    for group in groups:
        ids = [] if group is None else [group] if isinstance(group, int) else group
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or i < 0:
                raise ValueError(f"token ids must be non-negative ints, got {i!r} in {group!r}")
            if i not in out:
                out.append(i)
    return tuple(out)


def _rope_from_hf(hf: dict[str, Any], source: str, max_positions: int) -> RopeConfig:
    """As transformers 5 reads it (`convert_rope_params_to_dict`): a non-empty `rope_scaling`
    (the 4.x key) replaces `rope_parameters` whole, and theta is the chosen dict's
    `rope_theta`, else the top-level `rope_theta`, else 10000. `max_positions`: the model's
    length as read (config.json's, else the family's default)."""
    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
        )
    for key in _REQUIRED_ROPE_KEYS.get(rope_type, ()):
        if key not in params:
            raise CheckpointError(
                f"{source!r}: rope_type {rope_type!r} needs {key!r} in its rope dict "
                f"(rope_scaling / rope_parameters), which has {sorted(params)}; transformers "
                "refuses it too: restore the field (the model's own config.json has it)"
            )
    # transformers keeps the pretraining length only for the types that use it (llama3 here),
    # defaulting it to max_position_embeddings; the others leave ours at its default.
    original_max = {}
    if rope_type == "llama3":
        original_max["original_max_position_embeddings"] = int(
            params.get("original_max_position_embeddings", max_positions)
        )
    return RopeConfig(
        theta=float(theta),
        type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        **original_max,
    )

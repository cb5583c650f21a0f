"""Bytes per device of a model's arrays, from shapes alone (`nnx.eval_shape`, an
`AbstractMesh`, the logical-axis rules): what `learner.plan` and `learner.plan_rewards` build
their terms from. Nothing is allocated."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.models.presets import PRESETS as SHAPES
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.rules import SAMPLE_RULES, Rules, logical_to_spec


def model_config(checkpoint: str, **numerics: Any):
    """`ModelConfig` of a checkpoint directory, 'builtin', or a `SHAPES` name.

    A path that does not exist is matched by its last component (`/ckpts/Qwen2.5-Math-7B`
    -> 'qwen2.5-math-7b'), so paper configs can be planned before the weights are fetched.
    """
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.models import ModelConfig, read_config

    key = checkpoint.lower()
    if key not in SHAPES:
        path = resolve_checkpoint(checkpoint)
        if (Path(path) / "config.json").is_file():
            return ModelConfig.from_hf(read_config(path), **numerics)
        key = re.sub(r"-(instruct|base|hf)$", "", Path(checkpoint).name.lower())
        key = key.replace("meta-llama-3", "llama3").replace("llama-3", "llama3")
    if key not in SHAPES:
        raise ConfigError(
            f"checkpoint {checkpoint!r} has no config.json here and is not a known shape; "
            f"pass --model with one of {sorted(SHAPES)}"
        )
    return ModelConfig.from_hf(SHAPES[key], **numerics)


def abstract_mesh(data: int, fsdp: int, tensor: int):
    from jax.sharding import AbstractMesh

    return AbstractMesh((data, fsdp, tensor), ax.MESH_AXES)


def shard_numel(shape, logical, rules: Rules, mesh) -> int:
    """Elements of one device's shard of an array with these logical axes."""
    spec = logical_to_spec(logical, rules, mesh, shape)
    n = 1
    for i, dim in enumerate(shape):
        entry = spec[i] if i < len(spec) else None
        names = () if entry is None else (entry,) if isinstance(entry, str) else entry
        n *= dim // math.prod(mesh.shape[name] for name in names)
    return n


@functools.cache
def abstract_params(cfg, cls=None) -> tuple[tuple[tuple[int, ...], tuple, int], ...]:
    """(shape, logical axes, itemsize) of every parameter, from `nnx.eval_shape`."""
    from flax import nnx

    from jaxrl_llm.models import CausalLM

    cls = cls or CausalLM
    state = nnx.state(nnx.eval_shape(lambda: cls(cfg.replace(remat=False), rngs=nnx.Rngs(0))))
    return tuple(
        (var.shape, tuple(var.get_metadata()["logical_axes"]), var.get_value().dtype.itemsize)
        for _, var in nnx.to_flat_state(state)
    )


def param_bytes(cfg, mesh, rules: Rules, cls=None) -> tuple[int, int]:
    """(per-device bytes, total parameter count) of a model."""
    params = abstract_params(cfg.replace(remat=False), cls)
    per_device = sum(shard_numel(s, lg, rules, mesh) * n for s, lg, n in params)
    return per_device, sum(math.prod(s) for s, _, _ in params)


def kv_pool_bytes(cfg, mesh, slots: int, cache_len: int, kv_dtype: str = "auto") -> int:
    """The engine's paged pool (`rollout.Engine`): every slot can hold a full-length
    sequence; pages split over the batch axes that divide `slots` (`models.paged.batch_axes`,
    the engine's own rule; otherwise every device holds the whole pool), their count rounded
    up to a multiple of those shards, and kv heads over tensor. `kv_dtype`
    (`RolloutConfig.kv_cache_dtype`): 'auto' is the model's dtype; 'int8' adds a float32
    scale per head_dim values (`models.kv_int8.Int8Pages`)."""
    from jaxrl_llm.models.kv_int8 import pool_bytes_per_token
    from jaxrl_llm.models.paged import DEFAULT_PAGE_SIZE, batch_axes
    from jaxrl_llm.sharding.rules import ShardingContext

    axes = batch_axes(ShardingContext(mesh, SAMPLE_RULES), slots)
    shards = math.prod(mesh.shape[n] for n in axes)
    pages = slots * -(-cache_len // DEFAULT_PAGE_SIZE)
    pages = -(-pages // shards)  # per device
    heads = shard_numel((cfg.num_kv_heads,), (ax.ACT_KV_HEADS,), SAMPLE_RULES, mesh)
    numel = 2 * cfg.num_layers * pages * DEFAULT_PAGE_SIZE * heads * cfg.head_dim
    dtype = cfg.dtype if kv_dtype == "auto" else kv_dtype
    return numel * pool_bytes_per_token(1, cfg.head_dim, dtype) // cfg.head_dim


def host_mesh_shape(devices: int, devices_per_host: int, tensor: int) -> tuple[int, int, int]:
    """The mesh each host's rollout engine and scorers run on in a run of several processes
    (`sharding.hosts.local_sampling_mesh`: (local devices / tensor, 1, tensor) over that
    host's devices), with its errors."""
    if devices_per_host < 1 or devices % devices_per_host:
        raise ConfigError(
            f"--devices-per-host={devices_per_host} does not divide --devices={devices}: "
            "every host drives the same number of devices"
        )
    from jaxrl_llm.sharding.hosts import check_tensor_in_host

    check_tensor_in_host(tensor, devices_per_host)
    return devices_per_host // tensor, 1, tensor


@functools.cache
def _sampler_params(cfg, int8: bool) -> tuple[tuple[tuple[int, ...], tuple, np.dtype], ...]:
    """(shape, logical axes, dtype) of every array of the sampler's copy of the policy: the
    policy's, or with `int8` its int8 weights (projections, embedding, an untied LM head) and
    their scales (`quant.int8_projections`)."""
    from flax import nnx

    from jaxrl_llm.models import CausalLM
    from jaxrl_llm.models.quant import int8_projections

    def build():
        model = CausalLM(cfg.replace(remat=False), rngs=nnx.Rngs(0))
        return int8_projections(model) if int8 else model

    state = nnx.state(nnx.eval_shape(build))
    return tuple(
        (var.shape, tuple(var.get_metadata()["logical_axes"]), np.dtype(var.get_value().dtype))
        for _, var in nnx.to_flat_state(state)
    )


def sampler_copy_bytes(cfg, mesh, rules: Rules, dtype: str | None, int8: bool) -> int:
    """Per-device bytes of the sampler's copy in layout `rules`: float arrays in `dtype`
    (`PolicyConfig.rollout_dtype`; None: their own), int8 weights one byte each."""
    total = 0
    for shape, axes, kind in _sampler_params(cfg, int8):
        floating = np.issubdtype(kind, np.floating)
        size = np.dtype(dtype).itemsize if floating and dtype else kind.itemsize
        total += shard_numel(shape, axes, rules, mesh) * size
    return total

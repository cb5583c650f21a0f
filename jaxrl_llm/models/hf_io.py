"""Hugging Face checkpoints: safetensors in, safetensors out.

`from_pretrained` reads `config.json` and `model.safetensors` (or the shards listed in
`model.safetensors.index.json`) one tensor at a time: each tensor is read from the
memory-mapped file, converted to our layout, and handed to the devices with
`jax.make_array_from_callback`, so each device receives only its shard and the host never
holds more than one tensor (a folder with both forms is refused: readers differ on which
they load). `save_pretrained` writes plain weights (LoRA adapters merged, no int8) as files that
`transformers.AutoModelForCausalLM.from_pretrained` loads (a `ValueModel` is written as
`*ForTokenClassification` with one label, the layout verl's critic uses, or, with
`head="sequence"`, as a `*ForSequenceClassification` reward model).

The checkpoint's files (config.json, which safetensors file holds each tensor, reading one)
are `hf_files`; this module maps its tensors to the model's parameters and back.

Layout differences (ours <- HF): attention kernels are [D, N, H] <- [N*H, D]; the output
projection [N, H, D] <- [D, N*H]; dense kernels [in, out] <- [out, in].
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors.numpy import save_file

from jaxrl_llm.models.config import CheckpointError, ModelConfig, UnsupportedModelError, as_dtype
from jaxrl_llm.models.hf_files import (
    INDEX_FILE,
    SINGLE_FILE,
    check_tied_head,
    extra_stop_ids,
    read_config,
    read_tensor,
    weight_files,
)
from jaxrl_llm.models.lora import is_adapter
from jaxrl_llm.models.quant import SCALE_SUFFIX, quantize_variable
from jaxrl_llm.models.stop_tokens import GENERATION_CONFIG
from jaxrl_llm.models.transformer import CausalLM, ValueModel
from jaxrl_llm.sharding.hosts import to_host
from jaxrl_llm.sharding.rules import (
    TRAIN_RULES,
    Rules,
    ShardingContext,
    logical_sharding,
)

log = logging.getLogger(__name__)

# Tensors some checkpoints carry that hold no parameters.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


Transform = Callable[[np.ndarray], np.ndarray]


def _entry(path: tuple, cfg: ModelConfig) -> tuple[str, Transform, Transform]:
    """For one of our parameter paths: (HF tensor name, HF->ours, ours->HF)."""
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ident: Transform = lambda w: w
    transpose: Transform = lambda w: w.T
    names = [str(p) for p in path]
    leaf = names[-1]
    if names[0] == "lm_head":
        return "lm_head.weight", transpose, transpose
    if names[0] == "score":
        return "score.weight", transpose, transpose
    if names[0] == "score_bias":
        return "score.bias", ident, ident
    prefix = ".".join(names[:-1])
    heads = {"q_proj": N, "k_proj": K, "v_proj": K}
    if leaf == "embed_tokens":
        return "model.embed_tokens.weight", ident, ident
    if leaf == "weight":  # RMSNorm
        return f"{prefix}.weight", ident, ident
    if leaf in heads:
        n = heads[leaf]
        return (
            f"{prefix}.{leaf}.weight",
            lambda w: w.T.reshape(D, n, H),
            lambda w: w.reshape(D, n * H).T,
        )
    if leaf in ("q_bias", "k_bias", "v_bias"):
        n = heads[leaf[0] + "_proj"]
        return (
            f"{prefix}.{leaf[0]}_proj.bias",
            lambda w: w.reshape(n, H),
            lambda w: w.reshape(n * H),
        )
    if leaf == "o_proj":
        return (
            f"{prefix}.o_proj.weight",
            lambda w: w.T.reshape(N, H, D),
            lambda w: w.reshape(N * H, D).T,
        )
    if leaf in ("gate_proj", "up_proj", "down_proj"):
        return f"{prefix}.{leaf}.weight", transpose, transpose
    if leaf.endswith("_bias"):  # o_bias, gate_bias, up_bias, down_bias
        return f"{prefix}.{leaf[: -len('_bias')]}_proj.bias", ident, ident
    raise KeyError(f"no Hugging Face name for parameter {'/'.join(names)}")


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype="float32",
    param_dtype=None,
    mesh: Mesh | None = None,
    rules: Rules = TRAIN_RULES,
    cls: type[CausalLM] | type[ValueModel] = CausalLM,
    remat: bool = False,
    scan_layers: bool = False,
    quantize: Callable[[str], int | None] | None = None,
) -> CausalLM | ValueModel:
    """Load a Qwen2/Qwen3/Llama safetensors checkpoint into a `CausalLM` (or `ValueModel`).

    `dtype` is the compute dtype and, unless `param_dtype` is given, the storage dtype.
    `remat` and `scan_layers` set the `ModelConfig` options of the same names.
    The config's `stop_token_ids` come from `generation_config.json` and the chat template.
    With `mesh`, parameters are placed in their `rules` sharding as they are read.
    A `ValueModel` loaded from a policy checkpoint gets a zero-initialised score head.
    `quantize` (`lora.int8_weights(LoraConfig)`): each weight whose '/'-joined path it maps
    to input dims is stored as int8 (`quant.quantize_variable`) as soon as it is read, with
    its scales as `<name>_qscale`, so the float weights are never all resident.
    """
    path = Path(path)
    param_dtype = param_dtype or dtype
    hf = read_config(path)
    generation = path / GENERATION_CONFIG  # its JSON is checked by `extra_stop_ids`
    cfg = ModelConfig.from_hf(
        hf,
        source=str(path / "config.json"),
        dtype=str(as_dtype(dtype)),
        param_dtype=str(as_dtype(param_dtype)),
        remat=remat,
        scan_layers=scan_layers,
        stop_token_ids=extra_stop_ids(path, hf.get("eos_token_id")),
        generation_config=generation.read_text() if generation.is_file() else "",
    )
    files = weight_files(path)
    ctx = ShardingContext(mesh, rules) if mesh is not None else None
    abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0), sharding=ctx))
    graphdef, state = nnx.split(abstract)
    target = as_dtype(param_dtype)
    used: set[str] = set()
    scales: dict[tuple, nnx.Param] = {}
    for var_path, var in nnx.to_flat_state(state):
        hf_name, to_ours, _ = _entry(var_path, cfg)
        if hf_name not in files:
            if cls is ValueModel and hf_name.startswith("score"):
                log.info("%s: no %s in checkpoint; initialising it to zeros", path, hf_name)
                value = np.zeros(var.shape, dtype=target)
            else:
                raise CheckpointError(
                    f"tensor {hf_name!r} (parameter {'/'.join(map(str, var_path))}) "
                    f"is missing from {str(path)!r}"
                )
        else:
            used.add(hf_name)
            raw = read_tensor(files[hf_name], hf_name)
            expected = _entry(var_path, cfg)[2](np.empty(var.shape, dtype=np.int8)).shape
            if tuple(raw.shape) != tuple(expected):
                raise CheckpointError(
                    f"tensor {hf_name!r} has shape {tuple(raw.shape)} but config.json implies "
                    f"{tuple(expected)}"
                )
            value = to_ours(raw).astype(target)
        var.set_value(_place(value, var.get_metadata().get("logical_axes"), mesh, rules))
        in_dims = None if quantize is None else quantize("/".join(map(str, var_path)))
        if in_dims is not None:
            scales[var_path] = quantize_variable(var, in_dims)
    if cls is CausalLM and cfg.tie_word_embeddings:
        check_tied_head(files, path)
    unused = sorted(n for n in files if n not in used and not _IGNORED.match(n))
    if cls is ValueModel:
        unused = [n for n in unused if n != "lm_head.weight"]
    if unused:
        log.warning("%s: %d tensors not used, e.g. %s", path, len(unused), unused[:5])
    model = nnx.merge(graphdef, state)
    modules = dict(nnx.iter_modules(model))
    for var_path, scale in scales.items():
        setattr(modules[var_path[:-1]], f"{var_path[-1]}_qscale", scale)
    return model


def _place(value: np.ndarray, logical_axes, mesh: Mesh | None, rules: Rules) -> jax.Array:
    if mesh is None:
        return jnp.asarray(value)
    sharding = logical_sharding(logical_axes, rules, mesh, value.shape)
    return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])


def hf_tensors(model: CausalLM | ValueModel) -> Iterator[tuple[str, np.ndarray]]:
    """The model's parameters one at a time as (Hugging Face name, host array in HF's
    layout), bfloat16 as `ml_dtypes.bfloat16`: what `save_pretrained` writes and what a
    sampler that loads HF weights (vLLM) is pushed. Each is gathered whole onto every
    process's host (`hosts.to_host`, a collective: in a multi-process run every process
    iterates)."""
    cfg: ModelConfig = model.config
    flat = list(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    _check_plain([path for path, _ in flat])  # before the first tensor moves
    for var_path, var in flat:
        hf_name, _, to_hf = _entry(var_path, cfg)
        host = to_host(var.get_value())  # collective: every process takes part
        if host.dtype == jnp.bfloat16:
            host = host.view(ml_dtypes.bfloat16)
        yield hf_name, np.ascontiguousarray(to_hf(host))


def check_plain_weights(model: CausalLM | ValueModel) -> None:
    """A `ValueError` naming the fix unless every parameter of `model` has a Hugging Face
    name: LoRA adapters must be merged and an int8 base replaced by its float weights."""
    _check_plain([p for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))])


def _check_plain(flat: list[tuple]) -> None:
    """`check_plain_weights` on the parameters' paths."""
    if scaled := ["/".join(map(str, p)) for p in flat if str(p[-1]).endswith(SCALE_SUFFIX)]:
        raise ValueError(
            f"the model holds int8 weights ({scaled[0]}, ...), which Hugging Face files cannot "
            "hold: write the float model (from_pretrained without quantize; with adapters on "
            "an int8 base, lora.on_float_weights(model, float_model) then lora.merge_adapters, "
            "as `jaxrl-llm export` does)"
        )
    if adapted := ["/".join(map(str, p)) for p in flat if is_adapter(p)]:
        raise ValueError(
            f"the model has LoRA adapters ({adapted[0]}, ...): merge them first, "
            "lora.merge_adapters(model), as `jaxrl-llm export` does (or write the adapters "
            "alone with learner.export.save_peft_adapter)"
        )


VALUE_HEADS = {"token": "ForTokenClassification", "sequence": "ForSequenceClassification"}


def save_pretrained(
    model: CausalLM | ValueModel,
    path: str | os.PathLike,
    *,
    tokenizer=None,
    max_shard_bytes: int = 4 * 1024**3,
    head: str = "token",
) -> None:
    """Write `config.json` and safetensors (sharded with an index past `max_shard_bytes`).

    A `ValueModel` is written as `*ForTokenClassification` (`head="token"`: a critic) or as
    `*ForSequenceClassification` (`head="sequence"`: a reward model, as `rm:<folder>` and
    `transformers` load it); the latter has no bias in HF, so `score.bias` must be zero and
    is not written. Parameters are gathered one at a time. In a multi-process run every
    process must call this (the gathers are collective); only process 0 writes.
    """
    if head not in VALUE_HEADS:
        raise ValueError(f"head {head!r}: choose one of {sorted(VALUE_HEADS)}")
    check_plain_weights(model)  # before the folder is made
    path = Path(path)
    cfg: ModelConfig = model.config
    writer = jax.process_index() == 0
    if writer:
        path.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for hf_name, tensor in hf_tensors(model):
        if not writer:
            continue
        if head == "sequence" and hf_name == "score.bias":
            if np.any(tensor != 0):
                raise ValueError(
                    "a *ForSequenceClassification head has no bias, but score.bias is "
                    f"{tensor.tolist()}; save with head='token'"
                )
            continue
        if size and size + tensor.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][hf_name] = tensor
        size += tensor.nbytes
    if not writer:
        return
    hf = cfg.to_hf()
    if isinstance(model, ValueModel):
        arch = hf["architectures"][0].replace("ForCausalLM", VALUE_HEADS[head])
        hf.update(
            architectures=[arch], num_labels=1, id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0}
        )
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    generation = cfg.generation_to_hf()
    if generation is not None:
        (path / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(path / SINGLE_FILE), metadata=meta)
        (path / INDEX_FILE).unlink(missing_ok=True)
    else:
        weight_map = {}
        total = 0
        for i, shard in enumerate(shards, start=1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(path / fname), metadata=meta)
            weight_map.update(dict.fromkeys(shard, fname))
            total += sum(t.nbytes for t in shard.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        (path / SINGLE_FILE).unlink(missing_ok=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))


__all__ = [
    "CheckpointError",
    "UnsupportedModelError",
    "check_plain_weights",
    "from_pretrained",
    "hf_tensors",
    "save_pretrained",
]

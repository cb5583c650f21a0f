"""The checkpoint flags that `eval`, `generate` and `serve` share, and the load they drive.

A 7B model in float32 is 28 GB: it fits no 16 GB chip whole. So the model is read straight
into its sampling layout (`SAMPLE_RULES`: weights split over `tensor`, decode slots over
`data` x `fsdp`) on a `--mesh` of the local devices, one tensor at a time, each device
receiving only its shard, as the trainer loads into its training layout. `--dtype
auto` computes and stores in bfloat16 on accelerators (half the memory, half the bytes read
per decoded token) and float32 on CPU (the numerics the parity tests check).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any

DTYPES = ("auto", "float32", "bfloat16")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default="builtin", help="HF folder or 'builtin'")
    parser.add_argument(
        "--mesh",
        default="1,1,-1",
        help="DATA,FSDP,TENSOR sizes over the local devices; one may be -1 (all the rest), "
        "else the first DATA*FSDP*TENSOR devices. Default: every device on tensor (weights "
        "split, so the largest model fits)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="weights and compute; auto = bfloat16 on GPU/TPU, float32 on CPU",
    )


def parse_mesh(text: str) -> tuple[int, int, int]:
    """'1,1,-1' -> (1, 1, -1), with an error naming the flag for anything else."""
    parts = text.replace("x", ",").split(",")
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        sizes = ()
    if len(sizes) != 3:
        raise ValueError(f"--mesh must be DATA,FSDP,TENSOR integers (e.g. 1,1,-1), got {text!r}")
    data, fsdp, tensor = sizes
    return data, fsdp, tensor


def resolve_dtype(name: str, backend: str | None = None) -> str:
    """'auto' -> 'bfloat16' on GPU/TPU, 'float32' on CPU; other names pass through."""
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {DTYPES}, got {name!r}")
    if name != "auto":
        return name
    if backend is None:
        import jax

        backend = jax.default_backend()
    return "float32" if backend == "cpu" else "bfloat16"


@dataclasses.dataclass(frozen=True)
class SamplingModel:
    """A checkpoint loaded for sampling: its folder, the model (sharded on `mesh`), the
    tokenizer and the compute dtype chosen."""

    path: Path
    model: Any  # CausalLM
    tokenizer: Any
    mesh: Any  # jax.sharding.Mesh
    dtype: str


def load_sampling_model(args: argparse.Namespace, tokenizer: Any = None) -> SamplingModel:
    """Build the `--mesh` over local devices and load `--checkpoint` into it in `--dtype`;
    `tokenizer`: the checkpoint's, when the caller has loaded it already."""
    import jax

    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.models import CausalLM, from_pretrained, load_tokenizer
    from jaxrl_llm.sharding import SAMPLE_RULES, build_mesh

    path = resolve_checkpoint(args.checkpoint, "--checkpoint")
    sizes = parse_mesh(args.mesh)
    devices = jax.local_devices()
    if -1 not in sizes:  # a mesh of fixed size takes the first devices (e.g. 1,1,1: one chip)
        devices = devices[: max(1, math.prod(sizes))]
    mesh = build_mesh(*sizes, devices=devices)
    dtype = resolve_dtype(args.dtype)
    model = from_pretrained(path, dtype=dtype, mesh=mesh, rules=SAMPLE_RULES)
    assert isinstance(model, CausalLM)  # from_pretrained's default cls
    tokenizer = load_tokenizer(path) if tokenizer is None else tokenizer
    return SamplingModel(path, model, tokenizer, mesh, dtype)

"""A checkpoint folder's identity by content, `checkpoint_fingerprint`, and its model config as
this package reads it, `model_config`: what every run records of the base it trains on
(`learner.checkpoint.base_identity`), so that a resume or an export onto another base (a LoRA
run's, a KL reference's) or onto another model config (any run's) is refused rather than
silently wrong (docs/lora.md: what it reads, its cost, what it misses)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from jaxrl_llm.models.config import CheckpointError, ModelConfig
from jaxrl_llm.models.hf_files import read_config, weight_files

# config.json keys that name a tool or a storage default, not the model.
_NOT_THE_MODEL = frozenset({"transformers_version", "_name_or_path", "torch_dtype", "dtype"})
_WINDOWS, _WINDOW_BYTES = 4, 4096  # per tensor: 4 windows of 4 KiB, first to last byte


def checkpoint_fingerprint(path: str | os.PathLike) -> str:
    """16 hex digits identifying a checkpoint folder's model by content, not by path: SHA-256
    of config.json (less `_NOT_THE_MODEL`) and of each tensor's name, dtype, shape and four
    4 KiB windows of its bytes spread from its first byte to its last (all of a smaller
    tensor). Independent of the folder, of how the tensors are split into shards and of the
    files' own metadata; a further fine-tune of the same model changes every window. It
    reads the headers and at most 16 KiB per tensor (docs/lora.md: the cost)."""
    path = Path(path)
    digest = hashlib.sha256()
    config = {k: v for k, v in read_config(path).items() if k not in _NOT_THE_MODEL}
    digest.update(json.dumps(config, sort_keys=True).encode())
    files = weight_files(path)
    headers = {file: _header(file) for file in set(files.values())}
    with contextlib.ExitStack() as stack:
        handles = {file: stack.enter_context(open(file, "rb")) for file in headers}
        for name in sorted(files):
            header, data_start = headers[files[name]]
            if name not in header:
                raise CheckpointError(f"tensor {name!r} is missing from {str(files[name])!r}")
            entry = header[name]
            begin, end = (data_start + offset for offset in entry["data_offsets"])
            digest.update(json.dumps([name, entry["dtype"], entry["shape"]]).encode())
            f, size = handles[files[name]], end - begin
            step = (size - _WINDOW_BYTES) // (_WINDOWS - 1)
            spans = [(begin, size)] if size <= _WINDOWS * _WINDOW_BYTES else [
                (begin + i * step, _WINDOW_BYTES) for i in range(_WINDOWS)]  # fmt: skip
            for start, length in spans:
                f.seek(start)
                digest.update(f.read(length))
    return digest.hexdigest()[:16]


def model_config(path: str | os.PathLike) -> dict[str, Any]:
    """The folder's config.json as the model computes it: `ModelConfig.from_hf` written back
    (`to_hf`), less `_NOT_THE_MODEL`, in JSON's types. The same model spelt another way (4.x's
    `rope_theta` or 5.x's `rope_parameters`, keys this package does not read) gives the same."""
    source = str(Path(path) / "config.json")
    config = ModelConfig.from_hf(read_config(path), source=source).to_hf()
    return json.loads(json.dumps({k: v for k, v in config.items() if k not in _NOT_THE_MODEL}))


def _header(file: Path) -> tuple[dict, int]:
    """A safetensors file's header (name -> dtype, shape, data_offsets) and where its data
    starts: an 8-byte little-endian length, then that many bytes of JSON."""
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            return json.loads(f.read(n)), 8 + n
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read the safetensors header of {str(file)!r}: {e}") from e

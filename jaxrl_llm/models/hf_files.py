"""Hugging Face checkpoint folders as files: what a folder must hold, its config.json, which
safetensors file holds each tensor (one `model.safetensors` or the shards its index lists),
single tensors read from the memory-mapped files, and the stop ids beyond config.json's eos.

Every malformed file is a `CheckpointError` naming the file and the fix. The mapping between
these tensors and the model's parameters is `hf_io`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from jaxrl_llm.models.config import CheckpointError, merge_token_ids
from jaxrl_llm.models.stop_tokens import StopTokenError, read_stop_token_ids
from jaxrl_llm.models.tokenizer import check_tokenizer_files

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def check_checkpoint(path: str | os.PathLike, field: str, *, tokenizer: bool = True) -> None:
    """Fail now, naming `field` (the config field or flag that gave `path`), unless `path` is
    a folder with a `config.json` and (with `tokenizer`) a readable tokenizer file, so a wrong
    path ends a command before any model loads rather than deep inside the load."""
    path = Path(path)
    where = f"{field} {str(path)!r}" if field.startswith("--") else f"{field} = {str(path)!r}"
    expected = "expected a Hugging Face checkpoint folder (config.json, *.safetensors"
    expected += ", tokenizer.json) or 'builtin'" if tokenizer else ") or 'builtin'"
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "no such folder"
        raise CheckpointError(f"{where}: {what}; {expected}; fix the path")
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"{where}: no config.json in it; {expected}; point it at the folder holding config.json"
        )
    if tokenizer:
        check_tokenizer_files(path, where)


def read_config(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{str(cfg_file)!r} is missing: not a Hugging Face checkpoint")
    try:
        config = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{str(cfg_file)!r} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{str(cfg_file)!r} must hold a JSON object (the model's config), not a "
            f"{type(config).__name__}: not a Hugging Face config.json"
        )
    return config


def weight_files(path: Path) -> dict[str, Path]:
    """HF tensor name -> file holding it."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{str(index)!r} is not a valid safetensors index: {e}") from e
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(name, str) for name in weight_map.values()
        ):
            raise CheckpointError(f"{str(index)!r} is not a valid safetensors index: expected "
                                  "a 'weight_map' object of tensor name -> file name")  # fmt: skip
        files = {name: path / fname for name, fname in weight_map.items()}
        for f in set(files.values()):
            if not f.is_file():
                raise CheckpointError(f"shard {str(f)!r} listed in {INDEX_FILE} is missing")
        if (path / SINGLE_FILE).is_file():  # readers differ: no choice here matches them all
            raise CheckpointError(
                f"{str(path)!r} holds both {SINGLE_FILE} and {INDEX_FILE} with its shards; "
                "transformers loads the single file, vLLM the shards: remove the stale one"
            )
        return files
    single = path / SINGLE_FILE
    if not single.is_file():
        present = sorted(p.name for p in path.iterdir())
        raise CheckpointError(
            f"no {SINGLE_FILE} or {INDEX_FILE} in {str(path)!r} (found: {present}); "
            "only safetensors checkpoints are supported"
        )
    return {name: single for name in _tensor_names(single)}


def tensor_names(path: str | os.PathLike) -> set[str]:
    """The Hugging Face names of the tensors a checkpoint folder holds (single file or shards),
    read from the headers only: what a caller checks before loading (e.g. a score head)."""
    return set(weight_files(Path(path)))


def _tensor_names(file: Path) -> list[str]:
    try:
        with safe_open(file, framework="numpy") as f:
            return list(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read safetensors file {str(file)!r}: {e}") from e


def read_tensor(file: Path, name: str) -> np.ndarray:
    try:
        with safe_open(file, framework="numpy") as f:
            return f.get_tensor(name)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read tensor {name!r} from {str(file)!r}: {e}") from e


def check_tied_head(files: dict[str, Path], path: Path) -> None:
    """A tied model (`tie_word_embeddings`) uses its embedding as the LM head; a checkpoint
    that also holds an `lm_head.weight` must hold the same values. A different one is
    refused: transformers 4.x and vLLM would use the embedding, transformers 5.x the file's
    head, so no choice here computes what every reader of the folder does."""
    head, embed = "lm_head.weight", "model.embed_tokens.weight"
    if head not in files or embed not in files:
        return
    if not np.array_equal(read_tensor(files[head], head), read_tensor(files[embed], embed)):
        raise CheckpointError(
            f"{str(path)!r}: config.json ties the LM head to the embedding "
            f"(tie_word_embeddings = true) but the checkpoint's {head} differs from {embed}; "
            "transformers 4.x and vLLM would use the embedding, transformers 5.x the file's "
            "head: set tie_word_embeddings to false to use lm_head.weight, or remove it"
        )


def extra_stop_ids(path: Path, eos_token_id) -> tuple[int, ...]:
    """Stop ids beyond config.json's eos (`stop_tokens.read_stop_token_ids`)."""
    try:
        ids = read_stop_token_ids(path)
    except StopTokenError as e:
        raise CheckpointError(str(e)) from e
    eos = merge_token_ids(eos_token_id)
    return tuple(i for i in ids if i not in eos)


__all__ = [
    "INDEX_FILE",
    "SINGLE_FILE",
    "check_checkpoint",
    "check_tied_head",
    "extra_stop_ids",
    "read_config",
    "read_tensor",
    "tensor_names",
    "weight_files",
]

"""A checkpoint's tokenizer: its files checked, then loaded through `transformers`.

`transformers.AutoTokenizer` imports the library's whole auto-configuration tree, and with
it PyTorch whenever PyTorch is installed (`generation/logits_process.py`): importing it took
8.3 s on a 2-core AMD EPYC host (2026-12-04), importing `transformers.Qwen2Tokenizer` alone
2.2-3.1 s, without PyTorch. For the checkpoints whose tokenizer class `AutoTokenizer` is
known to pick by name, `load_tokenizer` imports that class alone; every other checkpoint
goes through `AutoTokenizer` as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from jaxrl_llm.models.config import CheckpointError

if TYPE_CHECKING:  # the defining module: `transformers` itself would have the type checker
    # read the package's whole lazy tree (`make test`'s basedpyright 25-28 s against 12-15 s)
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

# (config.json's model_type, tokenizer_config.json's tokenizer_class) pairs that
# `AutoTokenizer.from_pretrained` resolves to `transformers.<tokenizer_class>.from_pretrained`:
# the class is the one transformers registers for the model type (its
# `TOKENIZER_MAPPING_NAMES`), so AutoTokenizer's own choice is that class.
# tests/models/test_tokenizer.py checks each pair against the installed transformers.
DIRECT_CLASSES = frozenset({("qwen2", "Qwen2Tokenizer"), ("qwen3", "Qwen2Tokenizer")})

# A tokenizer folder needs one of these; without any, transformers builds an empty tokenizer
# (only the special tokens) and every prompt encodes to nothing.
_VOCAB_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")


def check_tokenizer_files(path: Path, where: str) -> None:
    """Fail, naming `where`, unless `path` holds a readable tokenizer file."""
    copy = "copy tokenizer.json and tokenizer_config.json again from the model it came from"
    tok = path / "tokenizer.json"
    if tok.is_file():
        try:
            json.loads(tok.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(
                f"{where}: tokenizer.json is not valid JSON ({e}); expected the file a "
                f"tokenizer's save_pretrained writes; {copy}"
            ) from e
    elif not any((path / name).is_file() for name in _VOCAB_FILES):
        raise CheckpointError(
            f"{where}: no tokenizer.json (nor {', '.join(_VOCAB_FILES[1:])}) in it; expected "
            f"the tokenizer saved beside the weights; {copy}"
        )


def direct_class_name(path: Path) -> str | None:
    """The tokenizer class `AutoTokenizer` would pick for `path` when it is one of
    `DIRECT_CLASSES` (and no custom code is named: `auto_map`); else None."""
    try:
        tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None  # AutoTokenizer reads them again and says what is wrong
    if not isinstance(tok_cfg, dict) or "auto_map" in tok_cfg:
        return None
    name = tok_cfg.get("tokenizer_class")
    return name if (model_type, name) in DIRECT_CLASSES else None


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer as `transformers.AutoTokenizer` loads it, local files only."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"tokenizer directory {str(path)!r} does not exist")
    check_tokenizer_files(path, f"cannot load a tokenizer from {str(path)!r}")
    name = direct_class_name(path)
    try:
        if name is not None:
            import transformers

            return getattr(transformers, name).from_pretrained(str(path), local_files_only=True)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot load a tokenizer from {str(path)!r}: {e}") from e


__all__ = ["DIRECT_CLASSES", "check_tokenizer_files", "load_tokenizer"]

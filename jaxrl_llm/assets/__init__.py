"""The small shipped checkpoint and tokenizer behind the built-in default.

`tiny-qwen2/` is a Qwen2-architecture causal LM (about 0.8 M parameters, 3 MB) with a
byte-level tokenizer without merges (one token per byte, so one per ASCII character, plus
Qwen's chat special tokens) saved as a `tokenizers` JSON that `transformers.AutoTokenizer`
loads. `build.py` makes it reproducibly: `python -m jaxrl_llm.assets.build`.
"""

from importlib import resources
from pathlib import Path

TINY_MODEL_NAME = "tiny-qwen2"


def builtin_checkpoint() -> Path:
    """Path of the shipped tiny checkpoint (config, safetensors, tokenizer)."""
    return Path(str(resources.files(__name__) / TINY_MODEL_NAME))


def resolve_checkpoint(path: str, field: str | None = None, *, tokenizer: bool = True) -> Path:
    """'builtin' names the shipped checkpoint; anything else is a directory path.

    With `field` (the config field or flag that gave `path`), the folder is checked now
    (`models.hf_files.check_checkpoint`: it exists, holds config.json and, with `tokenizer`, a
    readable tokenizer), so a wrong path is a `CheckpointError` naming `field`.
    """
    if path == "builtin":
        return builtin_checkpoint()
    if field is not None:
        from jaxrl_llm.models.hf_files import check_checkpoint

        check_checkpoint(path, field, tokenizer=tokenizer)
    return Path(path)

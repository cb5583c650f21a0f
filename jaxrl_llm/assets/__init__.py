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


def resolve_checkpoint(path: str) -> Path:
    """'builtin' names the shipped checkpoint; anything else is a directory path."""
    return builtin_checkpoint() if path == "builtin" else Path(path)

"""The token ids that end a sample, read from a Hugging Face folder's side files.

`config.json`'s `eos_token_id` is often the base model's end of text only. Instruct
checkpoints keep the token that closes an assistant turn elsewhere: Qwen2.5-Instruct lists
`<|im_end|>` in `generation_config.json` (as transformers' `generate` reads it), and a chat
template that ends each turn with `<|im_end|>` / `<|eot_id|>` makes that token the natural
stop even where no config names it. Without them an instruct model writes past its answer
until the length limit. Only JSON and the template text are read (no `transformers` import),
so loading a checkpoint stays light.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxrl_llm.models.config import merge_token_ids

GENERATION_CONFIG = "generation_config.json"
# Tokens that close a turn in common chat templates: ChatML (Qwen), Llama 3, Phi-3, Gemma.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


class StopTokenError(ValueError):
    """A side file that names stop tokens exists but cannot be read."""


def read_stop_token_ids(path: str | Path) -> tuple[int, ...]:
    """`generation_config.json`'s `eos_token_id` (int or list), then the id of each
    end-of-turn token the chat template writes; () when the folder has neither."""
    path = Path(path)
    generation = _json(path / GENERATION_CONFIG) or {}
    return merge_token_ids(generation.get("eos_token_id"), chat_template_stop_ids(path))


def chat_template_stop_ids(path: Path) -> tuple[int, ...]:
    """Ids of the `END_OF_TURN_TOKENS` that appear in the folder's chat template and in its
    tokenizer's added tokens."""
    template = chat_template_text(path)
    if not template:
        return ()
    ids = added_token_ids(path)
    return tuple(ids[t] for t in END_OF_TURN_TOKENS if t in template and t in ids)


def chat_template_text(path: Path) -> str:
    """The chat template(s) as one string: `chat_template.jinja` (transformers >= 4.43
    saves it there) or `tokenizer_config.json`'s `chat_template` (a string, or a list of
    {name, template})."""
    jinja = path / "chat_template.jinja"
    parts = [jinja.read_text()] if jinja.is_file() else []
    template: Any = (_json(path / "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(template, str):
        parts.append(template)
    elif isinstance(template, list):
        parts += [t.get("template", "") for t in template if isinstance(t, dict)]
    return "\n".join(parts)


def added_token_ids(path: Path) -> dict[str, int]:
    """content -> id of the tokenizer's added (special) tokens, from `tokenizer.json` and
    `tokenizer_config.json`'s `added_tokens_decoder`."""
    out: dict[str, int] = {}
    for tok in (_json(path / "tokenizer.json") or {}).get("added_tokens", []):
        out[tok["content"]] = int(tok["id"])
    decoder = (_json(path / "tokenizer_config.json") or {}).get("added_tokens_decoder", {})
    for i, tok in decoder.items():
        out.setdefault(tok["content"], int(i))
    return out


def _json(file: Path) -> dict[str, Any] | None:
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise StopTokenError(f"{str(file)!r} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise StopTokenError(f"{str(file)!r} must hold a JSON object, got {type(data).__name__}")
    return data

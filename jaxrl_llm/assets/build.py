"""Build the shipped tiny checkpoint: `python -m jaxrl_llm.assets.build [OUT_DIR]`.

Writes a character-level tokenizer and a seeded, randomly initialised Qwen2 model. The
supervised fine-tuning that teaches it the built-in task runs with `jaxrl-llm sft`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import ModelConfig, RopeConfig, init_model, save_pretrained

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Without tools, the plain ChatML of every shipped prompt. With `tools=` (agent
# environments, docs/agents.md) a system turn names each tool and its parameters, e.g.
# "tools: add(a, b) multiply(a, b)": a tiny byte-level model's prompt cannot spend Qwen's
# full JSON schemas (~300 tokens a tool); calls are written in Qwen's <tool_call> format.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for tool in tools %} "
    "{{ tool.function.name }}({{ tool.function.parameters.properties | join(', ') }})"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer():
    """A byte-level tokenizer with no merges: one token per byte, so one per ASCII character.

    It uses the same byte-to-unicode alphabet, split regex and decoder as Qwen2's BPE
    tokenizer, so `AutoTokenizer` (which picks `Qwen2Tokenizer` for a qwen2 config)
    reproduces it exactly; any UTF-8 text round-trips.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_config(tokenizer) -> ModelConfig:
    return ModelConfig(
        model_type="qwen2",
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        rope=RopeConfig(theta=10000.0),
        tie_word_embeddings=True,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def build(out: Path, seed: int = 0) -> Path:
    tokenizer = char_tokenizer()
    model = init_model(tiny_config(tokenizer), seed=seed)
    save_pretrained(model, out, tokenizer=tokenizer)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else builtin_checkpoint()
    print(build(target))

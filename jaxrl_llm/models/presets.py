"""Published shapes of common checkpoints (their HF config.json fields), in one place.

For planning a run before the weights are fetched (`jaxrl-llm plan`) and for benchmarks on
random weights of a real shape (`jaxrl-llm bench ... --checkpoint qwen2.5-0.5b`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_QWEN = dict(
    model_type="qwen2",
    hidden_act="silu",
    rms_norm_eps=1e-6,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    rope_theta=1e6,
)
PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(_QWEN, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-1.5b": dict(_QWEN, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2),
    "qwen2.5-7b": dict(_QWEN, vocab_size=152064, tie_word_embeddings=False, hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4),
    "llama3-8b": dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5,
                      vocab_size=128256, tie_word_embeddings=False, rope_theta=5e5,
                      max_position_embeddings=8192, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8),
}  # fmt: skip
_QWEN3 = dict(_QWEN, model_type="qwen3", max_position_embeddings=40960, head_dim=128,
              num_key_value_heads=8)  # fmt: skip
PRESETS["qwen3-0.6b"] = dict(_QWEN3, hidden_size=1024, intermediate_size=3072,
                             num_hidden_layers=28, num_attention_heads=16)  # fmt: skip
PRESETS["qwen3-8b"] = dict(_QWEN3, tie_word_embeddings=False, hidden_size=4096,
                           intermediate_size=12288, num_hidden_layers=36,
                           num_attention_heads=32)  # fmt: skip
PRESETS["qwen2.5-math-1.5b"] = dict(PRESETS["qwen2.5-1.5b"], max_position_embeddings=4096)
PRESETS["qwen2.5-math-7b"] = dict(PRESETS["qwen2.5-7b"], max_position_embeddings=4096)


def write_random_checkpoint(name: str, path: str | Path) -> Path:
    """A randomly initialised HF checkpoint of preset `name` at `path` (needs `transformers`
    and PyTorch: the `test` extra), seeded, for benchmarks on a real shape."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(PRESETS[name])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    return Path(path)

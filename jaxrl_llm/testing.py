"""Test doubles shipped with the package: tiny configs and Hugging Face checkpoints.

`write_reference_checkpoint` builds a random checkpoint with `transformers` (PyTorch), so
tests compare our model against an independent implementation; it needs the `test` extra.
"""

from __future__ import annotations

import os
from typing import Any

TINY_SHAPES: dict[str, Any] = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that the tiny test sequences cross the interpolated band.
    "original_max_position_embeddings": 16,
}


def write_reference_checkpoint(
    path: str | os.PathLike,
    model_type: str = "qwen2",
    *,
    seed: int = 0,
    dtype: str = "float32",
    **overrides: Any,
):
    """Save a randomly initialised HF Qwen2/Llama model to `path`; returns the torch model.

    Weights are perturbed away from HF's init (zero biases, unit norms) so that every
    parameter, biases and norm weights included, affects the logits.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    config_cls, model_cls = classes[model_type]
    kwargs = {**TINY_SHAPES, **overrides}
    torch.manual_seed(seed)
    config = config_cls(**kwargs)
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(path))
    return model


def digit_fraction_reward(
    response: str, ground_truth: Any = None, *, correct: float = 1.0, incorrect: float = 0.0
) -> float:
    """A dense test reward: the fraction of the response's characters that are digits.

    Even an untrained model's samples differ in it, so RL tests get a learning signal.
    """
    del ground_truth
    if not response:
        return incorrect
    frac = sum(ch.isdigit() for ch in response) / len(response)
    return incorrect + (correct - incorrect) * frac


def _register_test_rewards() -> None:
    from jaxrl_llm.rewards.registry import register_reward

    register_reward("digit_fraction")(digit_fraction_reward)


_register_test_rewards()

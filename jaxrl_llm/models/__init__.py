"""Flax NNX policy and value models for the Qwen2/Qwen2.5, Qwen3 (dense) and Llama-3 families."""

from jaxrl_llm.models.config import ModelConfig, RopeConfig, UnsupportedModelError
from jaxrl_llm.models.hf_files import read_config
from jaxrl_llm.models.hf_io import CheckpointError, from_pretrained, save_pretrained
from jaxrl_llm.models.init import init_model
from jaxrl_llm.models.tokenizer import load_tokenizer
from jaxrl_llm.models.transformer import CausalLM, KVCache, ValueModel

__all__ = [
    "CausalLM",
    "CheckpointError",
    "KVCache",
    "ModelConfig",
    "RopeConfig",
    "UnsupportedModelError",
    "ValueModel",
    "from_pretrained",
    "init_model",
    "load_tokenizer",
    "read_config",
    "save_pretrained",
]

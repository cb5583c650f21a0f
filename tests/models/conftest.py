import pytest

from jaxrl_llm.testing import LLAMA31_ROPE, write_reference_checkpoint

# (model_type, overrides): Qwen2 untied with q/k/v bias; Qwen2 tied; Llama-3.1 rope scaling
# with tied embeddings; Llama with attention and MLP biases and no GQA.
REFERENCE_VARIANTS = {
    "qwen2": ("qwen2", {"tie_word_embeddings": False, "rope_theta": 1000000.0}),
    "qwen2_tied": ("qwen2", {"tie_word_embeddings": True}),
    "llama31": ("llama", {"rope_scaling": LLAMA31_ROPE, "tie_word_embeddings": True}),
    "llama_bias": (
        "llama",
        {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 4, "rope_theta": 5e5},
    ),
}


@pytest.fixture(scope="session", params=sorted(REFERENCE_VARIANTS))
def reference_checkpoint(request, tmp_path_factory):
    """(name, path, torch model) for each reference variant, built once per session."""
    model_type, overrides = REFERENCE_VARIANTS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    torch_model = write_reference_checkpoint(path, model_type, seed=1, **overrides)
    return request.param, path, torch_model


@pytest.fixture(scope="session")
def qwen_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen_plain")
    torch_model = write_reference_checkpoint(path, "qwen2", seed=3)
    return path, torch_model

"""`ModelConfig`: the family flags follow `model_type` as Hugging Face's architecture has them,
and `from_hf` reads a config.json's rope as transformers does (its `AutoConfig` is the
oracle here: configs only, no model)."""

import json

import pytest
from transformers import AutoConfig

from jaxrl_llm.models import CheckpointError, ModelConfig, RopeConfig, UnsupportedModelError
from jaxrl_llm.testing import LLAMA31_ROPE

SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4,
             num_kv_heads=2, head_dim=8)  # fmt: skip
FLAGS = ("qkv_bias", "o_bias", "mlp_bias", "qk_norm")


def _flags(cfg: ModelConfig) -> tuple[bool, ...]:
    return tuple(getattr(cfg, f) for f in FLAGS)


@pytest.mark.parametrize(
    ("family", "want"),
    [("qwen2", (True, False, False, False)), ("qwen3", (False, False, False, True)),
     ("llama", (False, False, False, False))],
)  # fmt: skip
def test_flags_default_to_the_family(family, want):
    cfg = ModelConfig(model_type=family, **SHAPE)
    assert _flags(cfg) == want
    assert _flags(ModelConfig.from_hf(cfg.to_hf())) == want  # as save_pretrained writes it


@pytest.mark.parametrize(
    ("family", "flags"),
    [("llama", dict(qkv_bias=True, mlp_bias=True)), ("qwen3", dict(qkv_bias=True)),
     ("llama", dict(qkv_bias=True, o_bias=True))],
)  # fmt: skip
def test_allowed_flags_survive_the_hf_round_trip(family, flags):
    cfg = ModelConfig(model_type=family, **SHAPE, **flags)
    assert _flags(ModelConfig.from_hf(cfg.to_hf())) == _flags(cfg)


@pytest.mark.parametrize(
    ("family", "flags", "field"),
    [("qwen3", dict(qk_norm=False), "qk_norm"), ("qwen3", dict(mlp_bias=True), "mlp_bias"),
     ("qwen2", dict(qkv_bias=False), "qkv_bias"), ("qwen2", dict(o_bias=True), "o_bias"),
     ("qwen2", dict(qk_norm=True), "qk_norm"), ("llama", dict(qkv_bias=True, o_bias=False),
     "o_bias"), ("llama", dict(o_bias=True), "o_bias"), ("llama", dict(qk_norm=True), "qk_norm")],
)  # fmt: skip
def test_a_flag_the_family_cannot_have_is_refused_naming_it(family, flags, field):
    with pytest.raises(UnsupportedModelError) as error:
        ModelConfig(model_type=family, **SHAPE, **flags)
    message = str(error.value)
    assert f"ModelConfig.{field}" in message and repr(family) in message, message


def _transformers_rope(tmp_path, hf: dict) -> dict:
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return AutoConfig.from_pretrained(tmp_path).rope_parameters


def _llama(**rope) -> dict:
    hf = ModelConfig(model_type="llama", **SHAPE).to_hf()
    for key in ("rope_theta", "rope_scaling"):
        hf.pop(key)
    return {**hf, **rope}


@pytest.mark.parametrize(
    "rope",
    [
        dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4},
             rope_scaling={"rope_type": "linear", "factor": 4.0}, rope_theta=500.0),
        dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             rope_scaling={"rope_type": "linear", "factor": 4.0}),
        dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
             rope_theta=500.0),
        dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             rope_scaling={**LLAMA31_ROPE, "rope_theta": 7e5}, rope_theta=500.0),
        dict(rope_scaling={"type": "linear", "factor": 3.0}, rope_theta=2e5),
    ],
    ids=["scaling+parameters+theta", "scaling+parameters", "parameters+theta",
         "scaling with its theta", "old type key"],
)  # fmt: skip
def test_rope_parameters_and_rope_scaling_are_read_as_transformers_reads_them(tmp_path, rope):
    hf = _llama(**rope)
    want = _transformers_rope(tmp_path, hf)
    got = ModelConfig.from_hf(hf).rope
    assert (got.type, got.theta, got.factor) == (
        want["rope_type"], want["rope_theta"], want.get("factor", 1.0),
    )  # fmt: skip
    if got.type == "llama3":
        assert (got.low_freq_factor, got.high_freq_factor, got.original_max_position_embeddings
                ) == (want["low_freq_factor"], want["high_freq_factor"],
                      want["original_max_position_embeddings"])  # fmt: skip


@pytest.mark.parametrize(
    ("scaling", "missing"),
    [({"rope_type": "linear"}, "factor"), ({"type": "linear"}, "factor"),
     *[({k: v for k, v in LLAMA31_ROPE.items() if k != key}, key)
       for key in ("factor", "low_freq_factor", "high_freq_factor")]],
)  # fmt: skip
def test_a_rope_without_a_key_transformers_requires_is_refused_naming_it(
    tmp_path, scaling, missing
):
    hf = _llama(rope_scaling=scaling, rope_theta=5e5)
    with pytest.raises(KeyError, match=missing):  # transformers refuses it too
        _transformers_rope(tmp_path, hf)
    with pytest.raises(CheckpointError) as error:
        ModelConfig.from_hf(hf, source="ckpt/config.json")
    message = str(error.value)
    assert repr(missing) in message and "ckpt/config.json" in message, message


def test_llama3_original_max_defaults_to_max_position_embeddings_as_in_transformers(tmp_path):
    scaling = {k: v for k, v in LLAMA31_ROPE.items() if k != "original_max_position_embeddings"}
    hf = _llama(rope_scaling=scaling, rope_theta=5e5, max_position_embeddings=300)
    want = _transformers_rope(tmp_path, hf)["original_max_position_embeddings"]
    assert ModelConfig.from_hf(hf).rope.original_max_position_embeddings == want == 300


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_config_without_max_positions_reads_as_transformers_reads_it(tmp_path, family):
    """config.json without max_position_embeddings: the family's transformers default for
    the model's length and, with llama3 rope without its own, for the pretraining length
    the frequencies are scaled by (8192 before: frequencies off by up to 197% for Llama)."""
    hf = {**ModelConfig(model_type=family, **SHAPE).to_hf(), "rope_theta": 5e5}
    hf.pop("max_position_embeddings")
    if family == "llama":
        hf["rope_scaling"] = {
            k: v for k, v in LLAMA31_ROPE.items() if k != "original_max_position_embeddings"
        }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    want = AutoConfig.from_pretrained(tmp_path)
    got = ModelConfig.from_hf(hf)
    assert got.max_position_embeddings == want.max_position_embeddings
    if family == "llama":
        pretraining = want.rope_parameters["original_max_position_embeddings"]
        assert got.rope.original_max_position_embeddings == pretraining


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(),
        ModelConfig(model_type="qwen3", **SHAPE, tie_word_embeddings=True,
                    max_position_embeddings=512),
        ModelConfig(model_type="llama", **SHAPE, rope=RopeConfig(
            theta=5e5, type="llama3", factor=8.0, low_freq_factor=2.0, high_freq_factor=6.0,
            original_max_position_embeddings=16)),
        ModelConfig(model_type="llama", **SHAPE, rope=RopeConfig(type="linear", factor=4.0)),
        ModelConfig(model_type="qwen2", **SHAPE, rope=RopeConfig(theta=1e6, type="linear",
                                                                 factor=2.0)),
    ],
    ids=["default", "qwen3", "llama3 rope", "linear rope", "qwen2 linear rope"],
)  # fmt: skip
def test_from_hf_of_to_hf_gives_the_config_back(tmp_path, cfg):
    """What `save_pretrained` writes, `from_pretrained` reads back as the same config (the
    numerics fields, not in config.json, are left at their defaults here). yarn and longrope
    are not supported (`SUPPORTED_ROPE_TYPES`). transformers keeps the rope's pretraining
    length only for llama3, so only there is it read from config.json."""
    assert ModelConfig.from_hf(cfg.to_hf()) == cfg
    want = _transformers_rope(tmp_path, cfg.to_hf())
    assert ("original_max_position_embeddings" in want) == (cfg.rope.type == "llama3"), want

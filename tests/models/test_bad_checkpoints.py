"""Each bad checkpoint gets a clear error that names what is wrong."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm.models import (
    CheckpointError,
    ModelConfig,
    UnsupportedModelError,
    from_pretrained,
    load_tokenizer,
)


@pytest.fixture
def ckpt(qwen_checkpoint, tmp_path):
    path, _ = qwen_checkpoint
    dst = tmp_path / "ckpt"
    shutil.copytree(path, dst)
    return dst


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        from_pretrained(tmp_path / "nope")


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json.*missing"):
        from_pretrained(ckpt)


def test_missing_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        from_pretrained(ckpt)


def test_missing_shard_listed_in_index(ckpt):
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "gone.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"gone\.safetensors"):
        from_pretrained(ckpt)


def test_unsupported_architecture_is_named(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(model_type="mixtral", architectures=["MixtralForCausalLM"])
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="MixtralForCausalLM"):
        from_pretrained(ckpt)


def test_unsupported_rope_and_activation():
    base = ModelConfig().to_hf()
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(UnsupportedModelError, match="gelu"):
        ModelConfig.from_hf({**base, "hidden_act": "gelu"})
    with pytest.raises(UnsupportedModelError, match="sliding"):
        ModelConfig.from_hf({**base, "use_sliding_window": True})


def test_shape_mismatch_names_tensor(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = np.zeros((7, tensors[name].shape[1]), np.float32)
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"up_proj\.weight.*shape \(7, 64\)"):
        from_pretrained(ckpt)


def test_missing_tensor_is_named(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.0.self_attn.k_proj.bias"]
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"k_proj\.bias.*missing"):
        from_pretrained(ckpt)


@pytest.mark.parametrize("damage", ["truncate", "garbage_header"])
def test_corrupt_safetensors(ckpt, damage):
    f = ckpt / "model.safetensors"
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    else:
        f.write_bytes(b"\xff" * 8 + data[8:])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        from_pretrained(ckpt)


def test_bad_config_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        from_pretrained(ckpt)


def test_missing_tokenizer(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer"):
        load_tokenizer(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path / "empty")

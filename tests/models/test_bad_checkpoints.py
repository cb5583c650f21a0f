"""Each bad checkpoint gets a clear error that names what is wrong."""

import json
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm.assets import builtin_checkpoint, resolve_checkpoint
from jaxrl_llm.config_checks import ConfigError
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


@pytest.mark.slow  # 8 s in a loaded 2-worker run, AMD EPYC AVX2
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


def test_checkpoint_errors_are_config_errors():
    """The command line ends a `ConfigError` with its message and exit 2, no traceback."""
    assert issubclass(CheckpointError, ConfigError)
    assert issubclass(UnsupportedModelError, ConfigError)


def test_a_missing_checkpoint_folder_names_its_field(tmp_path):
    missing = tmp_path / "nope"
    message = (
        rf"^PolicyConfig\.checkpoint = '{re.escape(str(missing))}': no such folder; expected a "
        r"Hugging Face checkpoint folder \(config\.json, \*\.safetensors, tokenizer\.json\) "
        r"or 'builtin'; fix the path$"
    )
    with pytest.raises(CheckpointError, match=message):
        resolve_checkpoint(str(missing), "PolicyConfig.checkpoint")
    missing.mkdir()
    with pytest.raises(CheckpointError, match=r"--checkpoint .*: no config\.json in it"):
        resolve_checkpoint(str(missing), "--checkpoint")
    # Without a field nothing is checked (`plan` names shapes by paths not fetched yet).
    assert resolve_checkpoint(str(tmp_path / "later")) == tmp_path / "later"


@pytest.mark.parametrize("damage", ["missing", "not_json"])
def test_a_bad_tokenizer_is_named_before_loading(tmp_path, damage):
    tiny = tmp_path / "tiny"
    shutil.copytree(builtin_checkpoint(), tiny)
    if damage == "missing":  # transformers would build an empty tokenizer without complaint
        (tiny / "tokenizer.json").unlink()
        problem = r"no tokenizer\.json \(nor vocab\.json, tokenizer\.model, vocab\.txt\) in it"
    else:
        (tiny / "tokenizer.json").write_text('{"model": ')
        problem = r"tokenizer\.json is not valid JSON \(Expecting value: line 1 column 11"
    given = re.escape(f"--checkpoint '{tiny}'")
    with pytest.raises(CheckpointError, match=rf"^{given}: {problem}"):
        resolve_checkpoint(str(tiny), "--checkpoint")
    with pytest.raises(CheckpointError, match=rf"cannot load a tokenizer from .*: {problem}"):
        load_tokenizer(tiny)
    # A critic's checkpoint is read without its tokenizer.
    assert resolve_checkpoint(str(tiny), "critic", tokenizer=False) == tiny


def test_a_tied_checkpoint_with_a_different_lm_head_is_refused(tmp_path):
    """The built-in model ties its head to the embedding; a file that also holds an
    `lm_head.weight` loads when it is the same tensor and is refused when it differs
    (transformers 4.x and vLLM would use the embedding, 5.x the file's head)."""
    dst = tmp_path / "tied"
    shutil.copytree(builtin_checkpoint(), dst)
    weights = load_file(dst / "model.safetensors")
    embed = weights["model.embed_tokens.weight"]
    save_file({**weights, "lm_head.weight": embed.copy()}, dst / "model.safetensors")
    from_pretrained(dst)
    save_file({**weights, "lm_head.weight": -embed}, dst / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"lm_head\.weight differs from model\.embed"):
        from_pretrained(dst)

"""What a LoRA run records of its base (`checkpoint.base_identity`) and how a resume or an
export compares it (`checkpoint.check_base`): by content (`models.fingerprint`),
not by path, and by how the base was loaded."""

import json
import logging
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm.learner.checkpoint import base_identity, check_base
from jaxrl_llm.learner.rl_config import PolicyConfig
from jaxrl_llm.models.config import CheckpointError
from jaxrl_llm.models.fingerprint import checkpoint_fingerprint, model_config
from jaxrl_llm.models.hf_files import INDEX_FILE, SINGLE_FILE
from jaxrl_llm.models.lora import LoraConfig


@pytest.fixture
def base(builtin_copy):
    return builtin_copy


def test_the_fingerprint_is_the_content_not_the_folder_nor_its_files(base, tmp_path):
    """The same tensors in another folder, split into shards with an index, with other file
    metadata and other tool keys in config.json: the same fingerprint."""
    fingerprint = checkpoint_fingerprint(base)
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    sharded = tmp_path / "sharded"
    shutil.copytree(base, sharded)
    tensors = load_file(sharded / SINGLE_FILE)
    (sharded / SINGLE_FILE).unlink()
    names = sorted(tensors)
    halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, sharded / file, metadata={"format": "pt"})
    weight_map = {n: file for file, part in halves.items() for n in part}
    (sharded / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = json.loads((sharded / "config.json").read_text())
    config |= {"transformers_version": "9.9.9", "torch_dtype": "bfloat16"}
    (sharded / "config.json").write_text(json.dumps(config, indent=1))
    assert checkpoint_fingerprint(sharded) == fingerprint


@pytest.mark.parametrize("where", ["first", "last", "middle window"])
def test_a_changed_weight_or_config_changes_the_fingerprint(base, where):
    """One element changed at a tensor's first or last byte, or in the middle of its second
    sampled window (the embedding: 259 x 128 float32, 132,608 bytes, of which four 4 KiB
    windows are read, the second from byte (132,608 - 4,096) // 3)."""
    fingerprint = checkpoint_fingerprint(base)
    tensors = load_file(base / SINGLE_FILE)
    flat = tensors["model.embed_tokens.weight"].reshape(-1)
    second = (flat.nbytes - 4096) // 3 + 2048
    index = {"first": 0, "last": flat.size - 1, "middle window": second // 4}[where]
    flat[index] = np.nextafter(flat[index], np.float32(np.inf))
    save_file(tensors, base / SINGLE_FILE)
    assert checkpoint_fingerprint(base) != fingerprint


def test_a_changed_config_changes_the_fingerprint(base):
    fingerprint = checkpoint_fingerprint(base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "rope_theta": 20000.0}))
    assert checkpoint_fingerprint(base) != fingerprint


def test_check_base_compares_content_and_how_the_base_was_loaded(base, tmp_path, caplog):
    lora = PolicyConfig(lora=LoraConfig(rank=4))
    saved = base_identity(base, lora)
    assert saved == {"checkpoint": str(base), "fingerprint": checkpoint_fingerprint(base),
                     "config": model_config(base), "param_dtype": "float32",
                     "quantize_base": "none", "lora_alpha": "32.0"}  # fmt: skip
    args = dict(field="PolicyConfig.checkpoint", step_dir="run/checkpoints/3", loaded_as=True)

    moved = tmp_path / "moved"
    shutil.copytree(base, moved)
    check_base(saved, base_identity(moved, lora), **args)  # same content, another folder

    int8 = PolicyConfig(lora=LoraConfig(rank=4, quantize_base="int8"))
    with pytest.raises(CheckpointError, match=r"LoraConfig\.quantize_base = 'int8': .* = 'none'"):
        check_base(saved, base_identity(base, int8), **args)
    check_base(saved, base_identity(base, int8), **{**args, "loaded_as": False})  # export
    scaled = PolicyConfig(lora=LoraConfig(rank=4, alpha=16.0))  # rescales the adapters
    with pytest.raises(CheckpointError, match=r"LoraConfig\.alpha = 16\.0: .* = 32\.0 "):
        check_base(saved, base_identity(base, scaled), **args)
    bf16 = PolicyConfig(param_dtype="bfloat16", lora=LoraConfig(rank=4))
    with pytest.raises(CheckpointError, match=r"PolicyConfig\.param_dtype = 'bfloat16'"):
        check_base(saved, base_identity(base, bf16), **args)

    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    other = base_identity(moved, lora)
    with pytest.raises(CheckpointError) as error:
        check_base(saved, other, **args)
    assert str(error.value) == (
        f"PolicyConfig.checkpoint = '{moved}' is not the model this run was trained as: its "
        "config.json differs from the one checkpoint run/checkpoints/3 records (rms_norm_eps: "
        "saved 1e-06, now 1e-05); restore those fields or point PolicyConfig.checkpoint at the "
        f"model it records ('{base}'), or start a new run_dir"
    )
    # A record saved before model configs were recorded: the fingerprint covers config.json.
    no_config = {k: v for k, v in saved.items() if k != "config"}
    with pytest.raises(CheckpointError) as error:
        check_base(no_config, other, **args)
    assert str(error.value) == (
        f"PolicyConfig.checkpoint = '{moved}' (fingerprint {other['fingerprint']}) is not the "
        "base this run was trained on: checkpoint run/checkpoints/3 records "
        f"'{base}' (fingerprint {saved['fingerprint']}); point PolicyConfig.checkpoint at "
        "that model (in any folder: it is compared by content), or start a new run_dir"
    )

    with caplog.at_level(logging.WARNING):  # saved before bases were recorded
        check_base(None, other, **args)
    assert "checkpoint run/checkpoints/3 records no base model" in caplog.text

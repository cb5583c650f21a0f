"""A Hugging Face folder whose config.json or index is valid JSON of the wrong form ends the
load with one `CheckpointError` naming the file and the field, not a KeyError or an
AttributeError from deep in the loader (a copy of the shipped tiny checkpoint, edited)."""

import json

import pytest
from safetensors import safe_open

from jaxrl_llm.models import CheckpointError, from_pretrained
from jaxrl_llm.models.hf_files import INDEX_FILE, SINGLE_FILE

SHARD = "model-00001-of-00001.safetensors"


@pytest.fixture
def folder(builtin_copy):
    return builtin_copy


def _edit_config(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(edit(config)))


@pytest.mark.parametrize(
    "key", ["intermediate_size", "hidden_size", "num_attention_heads", "num_hidden_layers",
            "vocab_size"],
)  # fmt: skip
def test_a_config_without_a_required_field_names_the_file_and_the_field(folder, key):
    _edit_config(folder, lambda c: {k: v for k, v in c.items() if k != key})
    with pytest.raises(CheckpointError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert str(folder / "config.json") in message and repr(key) in message, message


@pytest.mark.parametrize("content", ["[]", '"qwen2"', "3"])
def test_a_config_that_is_not_an_object_names_the_file(folder, content):
    (folder / "config.json").write_text(content)
    with pytest.raises(CheckpointError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert str(folder / "config.json") in message and "JSON object" in message, message


@pytest.mark.parametrize(
    "index",
    [{"weight_map": [SHARD]}, [SHARD], {"weight_map": {"model.norm.weight": 3}}],
    ids=["weight_map a list", "index a list", "a file name not a string"],
)
def test_an_index_of_the_wrong_form_names_the_file_and_the_field(folder, index):
    (folder / SINGLE_FILE).rename(folder / SHARD)
    (folder / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert str(folder / INDEX_FILE) in message and "weight_map" in message, message


def test_a_folder_with_both_the_single_file_and_an_index_is_refused_naming_both(folder):
    """transformers loads model.safetensors, vLLM the shards the index lists: no choice here
    computes what every reader of the folder does."""
    (folder / SHARD).write_bytes((folder / SINGLE_FILE).read_bytes())
    with safe_open(folder / SINGLE_FILE, framework="numpy") as f:
        names = list(f.keys())
    (folder / INDEX_FILE).write_text(json.dumps({"weight_map": dict.fromkeys(names, SHARD)}))
    with pytest.raises(CheckpointError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert SINGLE_FILE in message and INDEX_FILE in message and str(folder) in message, message
    (folder / SINGLE_FILE).unlink()  # either form alone loads
    from_pretrained(folder)

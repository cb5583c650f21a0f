"""`load_tokenizer` loads what `transformers.AutoTokenizer` loads: the same class, ids, special
tokens and chat template, whether it takes the direct path (a class AutoTokenizer is known to
pick, imported alone) or AutoTokenizer itself. That a training run then imports no PyTorch
is checked in a fresh interpreter by tests/test_dependencies.py's one-step run."""

import json
import shutil

import pytest
from transformers import AutoTokenizer
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.models.tokenizer import DIRECT_CLASSES, direct_class_name

TEXTS = ["What is 17 * 23?", "  leading spaces, émojis 🙂 and\nnew lines\t", "<|im_end|> as text"]
CHAT = [{"role": "user", "content": "Add 2 and 3."}, {"role": "assistant", "content": "5"}]


def test_each_direct_class_is_the_one_transformers_registers_for_its_model_type():
    """AutoTokenizer picks a tokenizer_config.json's class by name when it is the class
    registered for config.json's model type; a transformers release that changes the
    registry fails here rather than loading a different tokenizer than AutoTokenizer."""
    for model_type, name in DIRECT_CLASSES:
        assert TOKENIZER_MAPPING_NAMES[model_type] == name, (model_type, name)


def _variant(tmp_path, name, *, model_type=None, tokenizer_class=None, auto_map=False):
    path = tmp_path / name
    shutil.copytree(builtin_checkpoint(), path)
    if model_type is not None:
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    if tokenizer_class is not None:
        tok_cfg["tokenizer_class"] = tokenizer_class
    if auto_map:
        tok_cfg["auto_map"] = {"AutoTokenizer": [None, "tokenization_custom.CustomTokenizer"]}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return path


@pytest.mark.parametrize(
    "variant, direct",
    [
        ({}, "Qwen2Tokenizer"),  # the shipped qwen2 checkpoint
        ({"model_type": "qwen3"}, "Qwen2Tokenizer"),
        ({"tokenizer_class": "PreTrainedTokenizerFast"}, None),  # Llama-3's kind of config
        ({"model_type": "llama"}, None),  # no class registered for llama: AutoTokenizer
    ],
    ids=["qwen2", "qwen3", "generic-class", "llama"],
)
def test_the_tokenizer_equals_autotokenizers(tmp_path, variant, direct):
    path = _variant(tmp_path, "ckpt", **variant)
    assert direct_class_name(path) == direct
    ours, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert type(ours) is type(auto)
    assert [ours.encode(t) for t in TEXTS] == [auto.encode(t) for t in TEXTS]
    assert ours.all_special_tokens == auto.all_special_tokens
    assert (ours.eos_token_id, ours.pad_token_id) == (auto.eos_token_id, auto.pad_token_id)
    assert ours.apply_chat_template(CHAT, tokenize=False) == auto.apply_chat_template(
        CHAT, tokenize=False
    )


def test_custom_code_is_never_taken_by_the_direct_path(tmp_path):
    assert direct_class_name(_variant(tmp_path, "remote", auto_map=True)) is None
    broken = _variant(tmp_path, "broken")
    (broken / "config.json").write_text("{not json")
    assert direct_class_name(broken) is None  # AutoTokenizer then says what is wrong

"""`prompt_data`: an RL run's train and validation pipelines from `DataConfig`: the size of
the validation set (`val_size`) concerns the built-in task only, 0 means no validation set,
and a chat template the tokenizer lacks is one `ConfigError` naming the field and the fix."""

import json

import pytest
from transformers import PreTrainedTokenizerFast

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.config import DataConfig
from jaxrl_llm.data.prompts import prompt_data


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_val_size_zero_builds_no_validation_set(tmp_path, char_tokenizer, caplog):
    d = DataConfig(val_size=0, template="raw", builtin_train_size=16)
    with caplog.at_level("INFO"):
        data = prompt_data(d, char_tokenizer, tmp_path)
    assert data.val is None
    assert data.train.report.kept == 16
    assert "no validation prompts" in caplog.text


@pytest.mark.parametrize("val_size", [0, 5, 64])
def test_a_val_file_is_scored_whole_in_batches_of_64_whatever_val_size(
    tmp_path, char_tokenizer, math_rows, val_size
):
    path = _write(tmp_path / "rows.jsonl", math_rows(70))
    d = DataConfig(train_file=path, val_file=path, val_size=val_size, template="raw")
    data = prompt_data(d, char_tokenizer, tmp_path)
    assert [len(batch) for batch in data.val.iterator()] == [64, 6]


def test_the_built_in_validation_set_has_val_size_problems(tmp_path, char_tokenizer):
    d = DataConfig(val_size=5, template="raw", builtin_train_size=16)
    data = prompt_data(d, char_tokenizer, tmp_path)
    assert [len(batch) for batch in data.val.iterator()] == [5]


def test_chat_template_missing_is_a_config_error_naming_the_field_and_checkpoint(
    tmp_path, char_tokenizer, math_rows
):
    char_tokenizer.save_pretrained(tmp_path / "base")  # a base model: no chat template
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "base"))
    path = _write(tmp_path / "rows.jsonl", math_rows(8))
    d = DataConfig(train_file=path, template="chat")
    with pytest.raises(ConfigError) as info:
        prompt_data(d, tokenizer, tmp_path)
    message = str(info.value)
    assert message.startswith("DataConfig.template = 'chat'"), message
    assert str(tmp_path / "base") in message and "'raw' or 'torl'" in message
    assert "\n" not in message

"""Prompt templates: raw, chat template, ToRL and Search-R1."""

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.templates import (
    SEARCH_R1_TEMPLATE,
    TORL_SYSTEM_PROMPT,
    prompt_messages,
    render_prompt,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
EXAMPLE = {"id": "1", "prompt": "What is 2 + 3", "answer": "5"}


@pytest.fixture
def chat_tokenizer(char_tokenizer):
    tok = char_tokenizer.__class__(tokenizer_object=char_tokenizer.backend_tokenizer)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_raw_is_the_prompt_itself():
    assert render_prompt(EXAMPLE, "raw") == "What is 2 + 3"


def test_chat_uses_the_tokenizer_chat_template(chat_tokenizer, char_tokenizer):
    text = render_prompt(EXAMPLE, "chat", tokenizer=chat_tokenizer)
    assert text == "<|user|>What is 2 + 3\n<|assistant|>"
    with_system = render_prompt(
        EXAMPLE, "chat", tokenizer=chat_tokenizer, system_prompt="Be exact."
    )
    assert with_system == "<|system|>Be exact.\n<|user|>What is 2 + 3\n<|assistant|>"
    with pytest.raises(
        ConfigError, match=r"template 'chat' .*renders .* has none: use 'raw' or 'torl'"
    ):
        render_prompt(EXAMPLE, "chat", tokenizer=char_tokenizer)


def test_torl_puts_its_instruction_in_the_system_turn(chat_tokenizer):
    messages = prompt_messages(EXAMPLE, "torl")
    assert messages == [
        {"role": "system", "content": TORL_SYSTEM_PROMPT},
        {"role": "user", "content": "What is 2 + 3"},
    ]
    assert "integrate natural language reasoning with programs" in TORL_SYSTEM_PROMPT
    assert render_prompt(EXAMPLE, "torl") == TORL_SYSTEM_PROMPT + "What is 2 + 3"
    chat = render_prompt(EXAMPLE, "torl", tokenizer=chat_tokenizer, use_chat_template=True)
    assert chat.startswith("<|system|>A conversation between User and Assistant.")


def test_search_r1_fills_the_question_with_a_question_mark():
    text = render_prompt(EXAMPLE, "search_r1")
    assert text == SEARCH_R1_TEMPLATE.format(question="What is 2 + 3?")
    assert text.startswith("Answer the given question. You must conduct reasoning inside <think>")
    assert text.endswith("<answer> Beijing </answer>. Question: What is 2 + 3?\n")
    already = dict(EXAMPLE, prompt="  Who?  ")
    assert render_prompt(already, "search_r1").endswith("Question: Who?\n")


def test_data_messages_are_kept_for_raw_and_unknown_template_fails():
    ex = dict(
        EXAMPLE, messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    )
    assert render_prompt(ex, "raw") == "S\nU"
    with pytest.raises(ValueError, match="unknown prompt template"):
        render_prompt(EXAMPLE, "alpaca")


@pytest.mark.parametrize("template", ["raw", "chat", "torl", "search_r1"])
def test_an_empty_system_prompt_means_no_system_turn_in_every_template(template, chat_tokenizer):
    with_system = dict(
        EXAMPLE, messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    )
    for example in (EXAMPLE, with_system):
        messages = prompt_messages(example, template, system_prompt="")
        assert [m["role"] for m in messages] == ["user"], messages
    text = render_prompt(EXAMPLE, template, tokenizer=chat_tokenizer, system_prompt="")
    assert TORL_SYSTEM_PROMPT not in text and "<|system|>" not in text

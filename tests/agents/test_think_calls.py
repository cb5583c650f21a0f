"""Calls drafted in a reasoning block are not run: a `<tool_call>` inside `<think>` ...
`</think>`, inside a `<think>` still open at the turn's end, or before a `</think>` whose
`<think>` the template's generation prompt wrote, is reasoning, in every format; a call
after `</think>` runs. Through `ChatToolUse` a turn whose only call is in its reasoning is
the final answer."""

import pytest

from jaxrl_llm.agents import ChatToolUse, ParsedTurn, ToolBox, ToolCall, parse_turn
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import load_tokenizer

from .tools_example import add

DRAFT = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "reasoning", "opened"),
    [
        (f"<think>\nMaybe {DRAFT}? No.\n</think>\n\n{CALL}", f"Maybe {DRAFT}? No.", False),
        (f"Plan: {DRAFT}\n</think>\n\n{CALL}", f"Plan: {DRAFT}", True),  # <think> in the prompt
        (f"<think>a</think>{CALL}<think>then {DRAFT}</think>", f"a\nthen {DRAFT}", False),
    ],
)
def test_a_call_after_the_reasoning_runs_and_one_inside_does_not(text, reasoning, opened):
    turn = parse_turn("qwen", text, prompt_opens_reasoning=opened)
    assert turn.calls == (ToolCall("add", {"a": 2, "b": 3}),)
    assert turn.malformed == () and turn.content == "" and turn.reasoning == reasoning


@pytest.mark.parametrize(
    "text",
    [
        f"<think>\nI will call {DRAFT}",  # still thinking when the turn ended
        f"<think>\nI will call {DRAFT}</think>",
        "<think>I will call <tool_call>\n{broken",  # a draft cut short: not malformed either
        f"<think>{DRAFT}</think>The answer is 2.",
    ],
)
def test_calls_only_in_the_reasoning_are_none(text):
    turn = parse_turn("qwen", text)
    assert (turn.calls, turn.malformed) == ((), ())
    assert turn.content == ("The answer is 2." if "answer" in text else "")


def test_a_turn_without_reasoning_parses_as_before():
    plain = f"Let me add.\n{CALL}"
    assert parse_turn("qwen", plain) == ParsedTurn(
        "Let me add.", (ToolCall("add", {"a": 2, "b": 3}),)
    )


def test_the_rule_holds_for_every_format():
    """A reasoning model that calls tools in Llama 3.1's JSON (DeepSeek-R1's Llama
    distillation): the call after the reasoning is read, the drafted one is not."""
    draft = '{"name": "add", "parameters": {"a": 1, "b": 1}}'
    turn = parse_turn("llama3_json", f'<think>{draft}</think>\n\n{{"name": "add", '
                                     '"parameters": {"a": 2, "b": 3}}')  # fmt: skip
    assert turn.calls == (ToolCall("add", {"a": 2, "b": 3}),) and turn.reasoning == draft
    assert parse_turn("llama3_json", f"<think>{draft}").calls == ()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


def test_chat_tool_use_runs_no_call_drafted_while_thinking(tokenizer):
    tool = ChatToolUse(ToolBox([add]), tokenizer)
    assert tool(f"<think>{DRAFT}</think>The answer is 2.<|im_end|>") is None  # final answer
    assert tool(f"<think>{DRAFT}<|im_end|>") is None
    obs = tool(f"<think>{DRAFT}</think>{CALL}<|im_end|>")
    assert obs is not None and "\n5<|im_end|>" in obs  # 2 + 3, not 1 + 1


def test_think_tags_that_are_special_tokens_still_mark_the_reasoning():
    """A tokenizer that makes <think> and </think> special tokens: the turn handed to the
    parser keeps them (other special tokens are removed), so the draft is still not run."""
    tok = load_tokenizer(builtin_checkpoint())
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    tool = ChatToolUse(ToolBox([add]), tok)
    turn, parsed, end = tool.chat.parse(f"<think>{DRAFT}</think>Done.<|im_end|>")
    assert (parsed.calls, parsed.content, end) == ((), "Done.", "<|im_end|>")
    assert turn.startswith("<think>")

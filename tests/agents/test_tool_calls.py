"""Tool calls parsed from the formats checkpoints write: Qwen/Hermes blocks and Llama 3.1
JSON, several per turn, and every malformed shape answered as a `MalformedCall`."""

import pytest

from jaxrl_llm.agents import PARSERS, MalformedCall, ParsedTurn, ToolCall, parse_turn
from jaxrl_llm.agents.tool_calls import register_parser

QWEN_TWO = (
    "I need both.\n<tool_call>\n"
    '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n<tool_call>\n'
    '{"name": "convert", "arguments": "{\\"value\\": 5, \\"unit\\": \\"km\\"}"}\n</tool_call>'
)


def test_qwen_turn_with_two_calls_and_content():
    turn = parse_turn("qwen", QWEN_TWO)
    assert turn.content == "I need both."
    assert turn.calls == (
        ToolCall("add", {"a": 2, "b": 3}),
        ToolCall("convert", {"value": 5, "unit": "km"}),  # arguments as a JSON string
    )
    assert turn.malformed == ()
    assert parse_turn("hermes", QWEN_TWO) == turn


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("{not json}", "not JSON"),
        ('["add", 1]', "must be a JSON object"),
        ('{"arguments": {}}', 'needs a "name"'),
        ('{"name": "add", "arguments": [1, 2]}', "must be an object"),
        ('{"name": "add", "arguments": "{oops"}', "arguments are not JSON"),
    ],
)
def test_qwen_malformed_calls_say_why(body, reason):
    turn = parse_turn("qwen", f"ok <tool_call>{body}</tool_call> and <tool_call>\n"
                              '{"name": "add", "arguments": {}}</tool_call>')  # fmt: skip
    assert turn.calls == (ToolCall("add", {}),)  # the good call is kept
    (bad,) = turn.malformed
    assert reason in bad.reason


def test_qwen_unclosed_block_and_plain_answer():
    turn = parse_turn("qwen", 'x <tool_call>{"name": "add", "arguments": {}}')
    assert turn.calls == () and turn.malformed[0].reason == "unclosed <tool_call> block"
    assert parse_turn("qwen", "The answer is 42.") == ParsedTurn("The answer is 42.")


def test_llama3_json_calls():
    one = parse_turn("llama3_json", '{"name": "add", "parameters": {"a": 1, "b": 2}}')
    assert one == ParsedTurn("", (ToolCall("add", {"a": 1, "b": 2}),))
    two = parse_turn(
        "llama3_json",
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "neg", "arguments": {}}',
    )
    assert [c.name for c in two.calls] == ["add", "neg"]
    assert parse_turn("llama3_json", "It is 3.") == ParsedTurn("It is 3.")
    bad = parse_turn("llama3_json", '{"name": "add", "parameters": {"a": 1}} {broken')
    assert [c.name for c in bad.calls] == ["add"]
    assert isinstance(bad.malformed[0], MalformedCall) and "not JSON" in bad.malformed[0].reason


def test_a_new_format_is_one_function(monkeypatch):
    monkeypatch.setattr("jaxrl_llm.agents.tool_calls.PARSERS", dict(PARSERS))

    @register_parser("colon")
    def colon(text):  # "CALL name" lines
        names = [line[5:] for line in text.splitlines() if line.startswith("CALL ")]
        return ParsedTurn("", tuple(ToolCall(n, {}) for n in names))

    assert parse_turn("colon", "CALL a\nCALL b").calls == (ToolCall("a", {}), ToolCall("b", {}))
    with pytest.raises(ValueError, match=r"'nope': expected one of .*register_parser"):
        parse_turn("nope", "")


DEEP = "[" * 1100  # past Python's recursion limit in json's decoder
HUGE = '{"name": "add", "arguments": {"a": ' + "9" * 4301 + ', "b": 1}}'  # int str limit


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("qwen", f"<tool_call>{DEEP}</tool_call>"),
        ("qwen", f"<tool_call>{HUGE}</tool_call>"),
        ("qwen", '<tool_call>{"name": "add", "arguments": "' + DEEP + '"}</tool_call>'),
        ("llama3_json", '{"name": "f", "parameters": ' + DEEP + "}"),
        ("llama3_json", HUGE),
    ],
)
def test_json_that_python_cannot_read_is_malformed_not_raised(fmt, text):
    """Deep nesting (RecursionError) and a > 4,300-digit integer (ValueError) are not
    `JSONDecodeError`s; each is a malformed call all the same."""
    turn = parse_turn(fmt, text)
    assert turn.calls == () and len(turn.malformed) == 1
    assert "JSON" in turn.malformed[0].reason

"""Functions as tools: schemas read by `transformers`, arguments checked by `jsonschema`,
and every failure (unknown tool, bad arguments, a raise, a hang past the timeout, a
malformed call) answered as an error message and counted, never raised."""

import time

import pytest

from jaxrl_llm.agents import FunctionTool, MalformedCall, ParsedTurn, ToolBox, ToolCall

from .tools_example import add, to_km


def hang(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "woke"


def test_schema_from_the_signature_and_docstring():
    schema = FunctionTool(add).schema
    assert schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "number", "description": "The first number."},
                    "b": {"type": "number", "description": "The second number."},
                },
                "required": ["a", "b"],
            },
            "return": {"type": "number"},
        },
    }
    assert [s["function"]["name"] for s in ToolBox([add, to_km]).schemas] == ["add", "to_km"]


def test_calls_and_their_errors_are_answered_and_counted():
    box = ToolBox([add, to_km, hang], timeout_s=0.2)
    turn = ParsedTurn(
        "",
        calls=(
            ToolCall("add", {"a": 2, "b": 3.5}),
            ToolCall("to_km", {"value": 2, "unit": "mile"}),
            ToolCall("add", {"a": "two", "b": 1}),  # wrong type
            ToolCall("add", {"a": 1}),  # missing argument
            ToolCall("to_km", {"value": 1, "unit": "inch"}),  # raises
            ToolCall("search", {"q": "x"}),  # unknown
            ToolCall("hang", {"seconds": 5}),  # past its timeout
        ),
        malformed=(MalformedCall("{oops", "not JSON: Expecting value"),),
    )
    t0 = time.perf_counter()
    answers = [m["content"] for m in box.answer(turn)]
    assert time.perf_counter() - t0 < 4  # the hang (5 s) did not hold the episode
    assert answers[:2] == ["5.5", "3.218688"]
    assert answers[2] == "Error: bad arguments for add: a: 'two' is not of type 'number'"
    assert answers[3] == "Error: bad arguments for add: 'b' is a required property"
    assert answers[4] == "Error: to_km raised ValueError: unknown unit 'inch'"
    assert answers[5].startswith("Error: unknown tool 'search'; the tools are add, to_km, hang")
    assert answers[6] == "Error: hang timed out (no answer within 0.2 s)"
    assert answers[7].startswith("Error: malformed tool call (not JSON: Expecting value)")
    m = box.metrics()
    assert (m["tools/add/calls"], m["tools/add/errors"]) == (3, 2)
    assert (m["tools/to_km/calls"], m["tools/to_km/errors"]) == (2, 1)
    assert (m["tools/hang/calls"], m["tools/hang/timeouts"]) == (1, 1)
    assert (m["tools/malformed"], m["tools/unknown"]) == (1, 1)
    assert 0.15 < m["tools/hang/latency_s"] < 4.0 and m["tools/add/latency_s"] < 1.0
    assert box.metrics()["tools/add/calls"] == 0  # read once


def test_a_toolbox_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="share a name"):
        ToolBox([add, add])
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        ToolBox([add], timeout_s=0)


def pairs(n: int) -> dict:
    """Pairs.

    Args:
        n: How many.
    """
    return {(i, i): i for i in range(n)}


def test_a_return_value_json_cannot_write_is_an_error_message():
    """A product of more than 4,300 digits (Python's int-to-str limit) from the built-in
    `multiply`, and a dict with tuple keys, answer "Error: ..." and count as errors."""
    from jaxrl_llm.agents.arithmetic import TOOLS

    big = int("1" + "0" * 2200)
    box = ToolBox([*TOOLS.values(), pairs])
    turn = ParsedTurn("", (ToolCall("multiply", {"a": big, "b": big}), ToolCall("pairs", {"n": 2})))
    answers = [m["content"] for m in box.answer(turn)]
    assert answers[0].startswith("Error: multiply returned a value that cannot be written: ")
    assert answers[1].startswith("Error: pairs returned a value that cannot be written: ")
    m = box.metrics()
    assert (m["tools/multiply/errors"], m["tools/pairs/errors"], m["tools/pairs/ran"]) == (1, 1, 1)

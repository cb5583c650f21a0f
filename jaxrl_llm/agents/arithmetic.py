"""The built-in agent environment, `RolloutConfig.env = "arithmetic"`: the built-in task's
word problems (or any rows with `prompt` and `answer`) with four calculator tools.

The model may call `add`, `subtract`, `multiply` and `divide` (several per turn, over several
turns) in its template's format; each call is answered as a `tool` message. A turn without a
call is the final answer: reward 1 when its last \\boxed{} equals the row's answer (as
numbers), else 0; intermediate turns earn 0. A turn the sampler cuts (budget, turn limit)
scores like a final one. Metrics: the `ToolBox`'s `tools/*` counters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jaxrl_llm.agents.env import Messages, StepResult, Turn
from jaxrl_llm.agents.functions import ToolBox, as_text
from jaxrl_llm.rewards.extraction import last_boxed


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def subtract(a: float, b: float) -> float:
    """Subtract b from a.

    Args:
        a: The number to subtract from.
        b: The number to subtract.
    """
    return a - b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor, not zero.
    """
    return a / b


def _number(text: str | None) -> float | None:
    try:
        return float(text.replace(",", "").strip()) if text is not None else None
    except ValueError:
        return None


class ArithmeticEnv:
    """One episode of an arithmetic word problem with calculator tools."""

    def __init__(self, timeout_s: float = 5.0):
        self.box = ToolBox(list(TOOLS.values()), timeout_s=timeout_s)
        self.tools = self.box.schemas
        self.answer: float | None = None

    def reset(self, row: Mapping[str, Any]) -> Messages:
        if "prompt" not in row or "answer" not in row:
            raise ValueError(f"the arithmetic environment needs 'prompt' and 'answer': {row}")
        self.answer = _number(str(row["answer"]))
        return [{"role": "user", "content": str(row["prompt"])}]

    def step(self, turn: Turn) -> StepResult:
        attempts = len(turn.calls) + len(turn.malformed)
        if attempts and not turn.final:
            return StepResult(self.box.answer(turn), 0.0, False, self.box.metrics())
        got = _number(last_boxed(turn.text))
        right = got is not None and self.answer is not None and abs(got - self.answer) < 1e-9
        return StepResult([], float(right), True, self.box.metrics())

    def close(self) -> None:
        """Nothing held: each tool call's thread ends with it."""


_OPS = {"+": "add", "-": "subtract", "*": "multiply", "//": "divide", "/": "divide"}


def demonstration(problem: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A worked episode for a built-in task problem (`data.tasks.arithmetic`): one call per
    operation of its solution (`print(a op b [op c])`), left to right, each in its own turn
    with the tool's answer after it, then "The answer is \\boxed{...}."; Qwen's call format."""
    code = str(problem["tool_solution"]).split("```python\n", 1)[1].split("\n", 1)[0]
    tokens = code.removeprefix("print(").removesuffix(")").split()
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(problem["prompt"])}]
    value: float = int(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2], strict=True):
        name, args = _OPS[op], {"a": value, "b": int(operand)}
        call = json.dumps({"name": name, "arguments": args})
        value = TOOLS[name](**args)
        messages.append({"role": "assistant", "content": f"<tool_call>{call}</tool_call>"})
        messages.append({"role": "tool", "name": name, "content": as_text(value)})
    answer = str(problem["answer"])
    messages.append({"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}."})
    return messages


TOOLS = {f.__name__: f for f in (add, subtract, multiply, divide)}

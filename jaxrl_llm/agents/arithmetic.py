"""The built-in agent environment, `RolloutConfig.env = "arithmetic"`: the built-in task's
word problems (or any rows with `prompt` and `answer`) with four calculator tools.

The model may call `add`, `subtract`, `multiply` and `divide` (several per turn, over several
turns) in its template's format; each call is answered as a `tool` message. A turn without a
call is the final answer: reward 1 when its last \\boxed{} equals the row's answer (as
numbers), else 0; intermediate turns earn 0. A turn the sampler cuts (budget, turn limit)
scores like a final one. Metrics: the `ToolBox`'s `tools/*` counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.agents.env import Messages, StepResult, Turn
from jaxrl_llm.agents.functions import ToolBox
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
        self.box = ToolBox([add, subtract, multiply, divide], timeout_s=timeout_s)
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

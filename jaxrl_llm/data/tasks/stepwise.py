"""Step-by-step text arithmetic for the arithmetic task: the no-tool side of a fair ToRL.

The arithmetic task's plain ``solution`` writes a multi-digit product in one line
(``47 * 385 = 18095.``), which a tiny model cannot compute in its head; a no-tool arm trained on
it measures what the model can do at all, not what RL adds. Here a product is taken apart by
place value so that every step is a 2-digit by 1-digit product or a sum, what a small model can
learn in text (the way a person does long multiplication)::

    47 * 300 = 14100.
    47 * 80 = 3760.
    47 * 5 = 235.
    14100 + 3760 + 235 = 18095.
    The answer is \\boxed{18095}.

Levels 1-2 keep the task's plain solution (already one mental step). The numbers are read
back from the problem's prompt (the task's templates put them in a fixed order), and the
result is checked against the problem's answer, so a template change fails loudly here.
Only characters of ``arithmetic.VOCABULARY`` are written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_ANSWER = "The answer is \\boxed{{{}}}."


def _place_parts(n: int) -> list[int]:
    """``385 -> [300, 80, 5]``; zero digits are skipped (``202 -> [200, 2]``)."""
    digits = str(n)
    return [int(d) * 10 ** (len(digits) - i - 1) for i, d in enumerate(digits) if d != "0"]


def product_steps(a: int, b: int) -> tuple[list[str], int]:
    """Lines of ``a * b`` by place value of the longer factor, and the product."""
    short, long = sorted((a, b), key=lambda x: (len(str(x)), x))
    parts = _place_parts(long)
    lines = [f"{short} * {p} = {short * p}." for p in parts]
    if len(parts) > 1:
        lines.append(" + ".join(str(short * p) for p in parts) + f" = {a * b}.")
    return lines, a * b


def stepwise_solution(problem: Mapping[str, Any]) -> str:
    """The step-by-step text solution of an arithmetic-task problem (levels 1-4)."""
    level = problem["level"]
    if level in (1, 2):
        return problem["solution"]
    numbers = [int(x) for x in re.findall(r"\d+", problem["prompt"])]
    if level == 3 and len(numbers) == 2:
        lines, answer = product_steps(*numbers)
    elif level == 4 and len(numbers) == 3:
        lines, product = product_steps(numbers[0], numbers[1])
        answer = product - numbers[2]
        lines.append(f"{product} - {numbers[2]} = {answer}.")
    else:
        raise ValueError(
            f"problem {problem.get('id')!r}: level {level} with numbers {numbers} in its prompt; "
            "expected level 3 with 2 numbers or level 4 with 3"
        )
    if str(answer) != problem["answer"]:
        raise ValueError(
            f"problem {problem.get('id')!r}: steps give {answer}, its answer is {problem['answer']}"
        )
    return "\n".join([*lines, _ANSWER.format(answer)])


def sft_rows(problems: Sequence[Mapping[str, Any]], style: str) -> list[dict[str, str]]:
    """Prompt/response rows for `jaxrl-llm sft`: ``style`` "tool" (ToRL Python solutions) or
    "stepwise" (this module's text solutions), same prompts either way."""
    if style not in ("tool", "stepwise"):
        raise ValueError(f"style must be 'tool' or 'stepwise', got {style!r}")
    return [
        {
            "prompt": p["prompt"],
            "response": p["tool_solution"] if style == "tool" else stepwise_solution(p),
        }
        for p in problems
    ]

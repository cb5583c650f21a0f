"""The built-in task: short arithmetic word problems with exact integer answers.

Difficulty levels (``LEVELS``): 1-2 can be done in the head (one addition or subtraction, a
times-table product or exact division); 3-4 call for a calculator (a 2-digit by 3-digit
product; a 3-digit by 2-digit product followed by a subtraction). A tiny character-level model
learns the easy ones from reasoning alone and needs the Python tool for the hard ones, which is
what the ToRL comparison (tool vs no tool) needs to show an effect.

Each problem is a dict with ``id``, ``prompt``, ``answer`` (the integer as a string), ``level``,
and two reference solutions, for SFT:

- ``solution``: plain reasoning, one ``x op y = z.`` line per step, then
  ``The answer is \\boxed{z}.``;
- ``tool_solution``: ToRL style: a ```python block that prints the result, an ```output block
  with exactly what it prints, then the same boxed answer.

Texts use a small fixed character set (``VOCABULARY``) so a tiny character-level tokenizer can
cover them. Generation is deterministic in the seed (Python's ``random.Random``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LEVELS = {
    1: "one addition or subtraction of numbers below 100 (mental)",
    2: "one times-table multiplication or exact division (mental)",
    3: "one 2-digit by 3-digit multiplication (calculator)",
    4: "a 3-digit by 2-digit multiplication, then a subtraction (calculator)",
}

NAMES = ("Ann", "Bob", "Sam", "Tom")
ITEMS = ("apple", "book", "card", "pen")
TOOL_INTRO = "Let me compute it in Python."
_ANSWER = "The answer is \\boxed{{{}}}."


@dataclasses.dataclass(frozen=True)
class _Kind:
    prompt: str  # str.format template: n (name), i (item), and the numbers
    steps: tuple[str, ...]  # plain reasoning lines
    expr: str  # the Python expression whose value is the answer


_KINDS = {
    "add": _Kind(
        "{n} has {a} {i}s and gets {b} more. How many {i}s does {n} have?",
        ("{a} + {b} = {ans}",),
        "{a} + {b}",
    ),
    "sub": _Kind(
        "{n} has {a} {i}s and gives away {b}. How many {i}s are left?",
        ("{a} - {b} = {ans}",),
        "{a} - {b}",
    ),
    "mul": _Kind(
        "{n} buys {a} boxes of {b} {i}s. How many {i}s is that?",
        ("{a} * {b} = {ans}",),
        "{a} * {b}",
    ),
    "div": _Kind(
        "{n} shares {t} {i}s equally among {a} friends. How many {i}s does each get?",
        ("{t} / {a} = {ans}",),
        "{t} // {a}",
    ),
    "mulsub": _Kind(
        "{n} buys {a} boxes of {b} {i}s and gives away {c}. How many {i}s are left?",
        ("{a} * {b} = {ab}", "{ab} - {c} = {ans}"),
        "{a} * {b} - {c}",
    ),
}


def _sample(level: int, rng: random.Random) -> tuple[str, dict[str, int]]:
    """Picks a problem kind and its numbers for ``level``; the answer is computed here."""
    if level == 1:
        if rng.random() < 0.5:
            a, b = rng.randint(2, 50), rng.randint(2, 49)
            return "add", {"a": a, "b": b, "ans": a + b}
        a = rng.randint(11, 99)
        b = rng.randint(1, a - 1)
        return "sub", {"a": a, "b": b, "ans": a - b}
    if level == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        if rng.random() < 0.5:
            return "mul", {"a": a, "b": b, "ans": a * b}
        return "div", {"a": a, "t": a * b, "ans": b}
    if level == 3:
        a, b = rng.randint(12, 99), rng.randint(101, 999)
        return "mul", {"a": a, "b": b, "ans": a * b}
    if level == 4:
        a, b, c = rng.randint(101, 999), rng.randint(11, 99), rng.randint(10, 999)
        return "mulsub", {"a": a, "b": b, "c": c, "ab": a * b, "ans": a * b - c}
    raise ValueError(f"unknown level {level}; levels are {sorted(LEVELS)}")


def plain_solution(kind: str, values: dict[str, int]) -> str:
    """Step-by-step reasoning ending in ``\\boxed{answer}``."""
    lines = [step.format(**values) + "." for step in _KINDS[kind].steps]
    return "\n".join([*lines, _ANSWER.format(values["ans"])])


def tool_solution(kind: str, values: dict[str, int]) -> str:
    """ToRL-style solution: a ```python block, its ```output, then ``\\boxed{answer}``."""
    code = f"print({_KINDS[kind].expr.format(**values)})"
    return (
        f"{TOOL_INTRO}\n```python\n{code}\n```\n```output\n{values['ans']}\n```\n"
        + _ANSWER.format(values["ans"])
    )


def make_problem(level: int, rng: random.Random, problem_id: str) -> dict[str, Any]:
    """One problem of ``level`` drawn from ``rng``."""
    kind, values = _sample(level, rng)
    prompt = _KINDS[kind].prompt.format(n=rng.choice(NAMES), i=rng.choice(ITEMS), **values)
    return {
        "id": problem_id,
        "prompt": prompt,
        "answer": str(values["ans"]),
        "level": level,
        "solution": plain_solution(kind, values),
        "tool_solution": tool_solution(kind, values),
    }


HELDOUT_PERCENT = 10
SPLITS = ("train", "val")


def split_of(prompt: str) -> str:
    """The split a prompt belongs to, fixed by a hash of its text: "val" for 10% of all
    possible problems, "train" for the rest.

    Every consumer (SFT, RL training, validation, `jaxrl-llm eval`) draws from the same
    partition, whatever seeds and sizes it uses, so validation prompts are never trained on.
    The problem space is small at level 2 (times tables), where a split by generation order
    would leak.
    """
    digest = hashlib.sha256(prompt.encode()).digest()
    return "val" if int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT else "train"


def generate_problems(
    n: int,
    *,
    seed: int = 0,
    levels: Sequence[int] = (1, 2, 3, 4),
    id_prefix: str = "arith",
    exclude_prompts: set[str] | frozenset[str] = frozenset(),
    split: str | None = None,
) -> list[dict[str, Any]]:
    """``n`` distinct problems, levels drawn uniformly from ``levels``, deterministic in ``seed``.

    Ids are ``f"{id_prefix}-{i:05d}"``. Prompts in ``exclude_prompts`` (e.g. the training
    split's) are never produced. ``split`` ("train" | "val") keeps only problems of that
    split (see ``split_of``); None keeps all.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    for level in levels:
        if level not in LEVELS:
            raise ValueError(f"unknown level {level}; levels are {sorted(LEVELS)}")
    rng = random.Random(seed)
    seen = set(exclude_prompts)
    problems: list[dict[str, Any]] = []
    while len(problems) < n:
        problem = make_problem(rng.choice(list(levels)), rng, f"{id_prefix}-{len(problems):05d}")
        prompt = problem["prompt"]
        if prompt not in seen and (split is None or split_of(prompt) == split):
            seen.add(prompt)
            problems.append(problem)
    return problems


def write_jsonl(problems: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Writes rows one JSON object per line, atomically (a temporary file, then a rename), so
    processes of a multi-host run that share a filesystem may all write the same file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(problem) + "\n" for problem in problems)
    os.replace(tmp, path)
    return path


def write_splits(
    out_dir: str | os.PathLike,
    *,
    n_train: int = 2000,
    n_val: int = 200,
    seed: int = 0,
    levels: Sequence[int] = (1, 2, 3, 4),
) -> dict[str, Path]:
    """Writes ``train.jsonl`` and ``val.jsonl`` into ``out_dir``, drawn from the train and
    val sides of the fixed partition (``split_of``), so no prompt is in both.

    Returns:
      ``{"train": path, "val": path}``.
    """
    train = generate_problems(n_train, seed=seed, levels=levels, id_prefix="train", split="train")
    val = generate_problems(
        n_val, seed=seed + 1_000_003, levels=levels, id_prefix="val", split="val"
    )
    out_dir = Path(out_dir)
    return {
        "train": write_jsonl(train, out_dir / "train.jsonl"),
        "val": write_jsonl(val, out_dir / "val.jsonl"),
    }


def _vocabulary() -> str:
    fixed = [re.sub(r"\{\w+\}", "", kind.prompt) for kind in _KINDS.values()]
    fixed += [re.sub(r"\{\w+\}", "", s) for kind in _KINDS.values() for s in kind.steps]
    fixed += [re.sub(r"\{\w+\}", "", kind.expr) for kind in _KINDS.values()]
    fixed += [*NAMES, *ITEMS, string.digits, ".\n", TOOL_INTRO, "```python\nprint()```output"]
    fixed.append(_ANSWER.format(""))
    return "".join(sorted(set("".join(fixed))))


VOCABULARY: str = _vocabulary()
"""Every character the task's prompts and solutions can contain, sorted."""

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

from jaxrl_llm.config_checks import ConfigError

LEVELS = {
    1: "one addition or subtraction of numbers below 100 (mental)",
    2: "one times-table multiplication or exact division (mental)",
    3: "one 2-digit by 3-digit multiplication (calculator)",
    4: "a 3-digit by 2-digit multiplication, then a subtraction (calculator)",
}


def check_levels(field: str, levels: tuple[int, ...]) -> None:
    """`ConfigError` unless `levels` is one or more of `LEVELS`; `field` names the setting
    (`DataConfig.builtin_levels`, `SFTConfig.levels`, `RMConfig.levels`)."""
    if not levels or any(v not in LEVELS for v in levels):
        raise ConfigError(
            f"{field} = {levels!r}: expected one or more of the built-in task's levels "
            f"{tuple(sorted(LEVELS))}"
        )


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
    split (see ``split_of``); None keeps all. The space is finite (2,816 level-2 prompts, of
    which about 2,545 are in "train"): asking for more than ``levels`` and ``split`` hold
    raises ``ConfigError`` with their count (checked after a long run of repeated draws).
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    for level in levels:
        if level not in LEVELS:
            raise ValueError(f"unknown level {level}; levels are {sorted(LEVELS)}")
    rng = random.Random(seed)
    seen = set(exclude_prompts)
    problems: list[dict[str, Any]] = []
    misses = 0
    while len(problems) < n:
        problem = make_problem(rng.choice(list(levels)), rng, f"{id_prefix}-{len(problems):05d}")
        prompt = problem["prompt"]
        if prompt not in seen and (split is None or split_of(prompt) == split):
            seen.add(prompt)
            problems.append(problem)
            misses = 0
            continue
        misses += 1  # a long run of repeats: the space may be (nearly) used up
        if misses in (MISSES_BEFORE_COUNTING, MISSES_BEFORE_GIVING_UP):
            _check_reachable(
                n, levels, split, exclude_prompts, gave_up=misses > MISSES_BEFORE_COUNTING
            )
    return problems


MISSES_BEFORE_COUNTING = 1_000
MISSES_BEFORE_GIVING_UP = 1_000_000
ENUMERABLE = 200_000  # prompts: the mental levels (1: 114,528; 2: 2,816) are counted exactly


def _values(level: int) -> list[tuple[str, dict[str, int]]]:
    """Every (kind, numbers) `_sample` can draw at a mental level (1, 2)."""
    if level == 1:
        add = [("add", {"a": a, "b": b}) for a in range(2, 51) for b in range(2, 50)]
        return add + [("sub", {"a": a, "b": b}) for a in range(11, 100) for b in range(1, a)]
    pairs = [(a, b) for a in range(2, 10) for b in range(2, 13)]
    return [("mul", {"a": a, "b": b}) for a, b in pairs] + [
        ("div", {"a": a, "t": a * b}) for a, b in pairs
    ]


def level_size(level: int) -> int:
    """How many distinct prompts ``level`` has, before the split (each prompt shows all its
    numbers, so distinct numbers, names or items give distinct prompts)."""
    people = len(NAMES) * len(ITEMS)
    counts = {1: (49 * 48 + sum(range(10, 99))), 2: 2 * 8 * 11, 3: 88 * 899, 4: 899 * 89 * 990}
    return counts[level] * people


def _all_prompts(level: int):
    for kind, values in _values(level):
        for name in NAMES:
            for item in ITEMS:
                yield _KINDS[kind].prompt.format(n=name, i=item, **values)


def _check_reachable(
    n: int, levels: Sequence[int], split: str | None, exclude: set[str] | frozenset[str],
    *, gave_up: bool,
) -> None:  # fmt: skip
    """Raises ``ConfigError`` when ``levels`` and ``split`` (less ``exclude``) hold fewer than
    ``n`` distinct prompts: counted exactly where the space is small enough to list; else,
    after ``MISSES_BEFORE_GIVING_UP`` draws in a row with no new prompt, with the size
    before the split as the bound. Otherwise returns, and drawing goes on."""
    where = f"levels {tuple(levels)}, split {split!r}"
    fix = "ask for fewer, or add levels (arithmetic.LEVELS)"
    total = sum(level_size(level) for level in set(levels))
    if total <= ENUMERABLE:
        prompts = {p for level in set(levels) for p in _all_prompts(level)}
        available = sum(
            p not in exclude and (split is None or split_of(p) == split) for p in prompts
        )
        if n > available:
            excluded = f" (less the {len(exclude)} excluded prompts)" if exclude else ""
            raise ConfigError(
                f"{n} distinct arithmetic problems asked of {where}{excluded}, which hold "
                f"{available} distinct problems: {fix}"
            )
    elif gave_up:
        raise ConfigError(
            f"{n} distinct arithmetic problems asked of {where}: no new one in "
            f"{MISSES_BEFORE_GIVING_UP:,} draws in a row; those levels hold at most {total:,} "
            f"distinct problems before the split: {fix}"
        )


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

"""A built-in prompt set whose items differ in how much they teach: the LIMR miniature's task.

LIMR's claim is that prompts differ in learning value and that a selection by learning curve
(LIM) finds the valuable ones. On the plain arithmetic task nearly every prompt teaches the
same behaviour, so selection has nothing to find. This set mixes three kinds of item
(``ITEM_KINDS``), in proportions the caller chooses:

- ``easy``: level-1 problems (one mental addition or subtraction). The shipped model solves
  about half at temperature 1 before RL and nearly all after a few steps: they teach a little,
  early, then nothing (a group of all-correct samples has zero GRPO advantage).
- ``hard``: level-3/4 problems (a multi-digit product) solved about half the time at first,
  more often once RL moves the model to the Python tool: the signal RL learns from.
- ``noisy``: level-3/4 problems whose reference answer is wrong (the true answer moved by a
  non-zero offset): no response earns the reward, so they never teach; in a batch they only
  dilute the gradient (token-mean loss over samples with zero advantage).

Each row is an arithmetic-task problem (``id``, ``prompt``, ``answer``, ``level``) plus
``item_kind`` so a report can count what a selection kept; the model never sees that field.
Prompts come from the arithmetic task's train partition, so the task's standard validation
split (clean problems) measures what training taught. Deterministic in ``seed``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_llm.data.tasks import arithmetic

ITEM_KINDS = ("easy", "hard", "noisy")
_LEVELS = {"easy": (1,), "hard": (3, 4)}


def _noisy_answer(answer: str, rng: random.Random) -> str:
    """A wrong label: the true answer moved by 1-9 units or tens, never onto itself."""
    offset = rng.randint(1, 9) * rng.choice((1, 10)) * rng.choice((-1, 1))
    return str(int(answer) + offset)


def generate_mix(counts: Mapping[str, int], *, seed: int = 0) -> list[dict[str, Any]]:
    """Items of each kind in ``counts`` (e.g. ``{"easy": 16, "hard": 20, "noisy": 12}``),
    shuffled together, ids ``mix-00000``... in the shuffled order.

    Raises:
      ValueError: a kind not in ``ITEM_KINDS`` or a negative count.
    """
    for kind, n in counts.items():
        if kind not in ITEM_KINDS:
            raise ValueError(f"item kind {kind!r} is not one of {ITEM_KINDS}")
        if n < 0:
            raise ValueError(f"count of {kind!r} items must be >= 0, got {n}")
    rng = random.Random(seed)
    problems = arithmetic.generate_problems(
        counts.get("hard", 0) + counts.get("noisy", 0),
        seed=seed,
        levels=_LEVELS["hard"],
        split="train",
    )
    easy = arithmetic.generate_problems(
        counts.get("easy", 0), seed=seed + 1, levels=_LEVELS["easy"], split="train"
    )
    items: list[dict[str, Any]] = [{**p, "item_kind": "easy"} for p in easy]
    n_hard = counts.get("hard", 0)
    for i, p in enumerate(problems):
        if i < n_hard:
            items.append({**p, "item_kind": "hard"})
        else:
            items.append({**p, "answer": _noisy_answer(p["answer"], rng), "item_kind": "noisy"})
    rng.shuffle(items)
    keep = ("prompt", "answer", "level", "item_kind")
    return [{"id": f"mix-{i:05d}", **{k: item[k] for k in keep}} for i, item in enumerate(items)]


def count_kinds(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many rows of each item kind (every kind listed, zeros included)."""
    out: dict[str, int] = dict.fromkeys(ITEM_KINDS, 0)
    for row in rows:
        kind = row.get("item_kind")
        if kind not in out:
            raise ValueError(f"row {row.get('id')!r} has item_kind {kind!r}, expected {ITEM_KINDS}")
        out[kind] += 1
    return out

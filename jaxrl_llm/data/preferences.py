"""Preference pairs for reward-model training (`jaxrl-llm rm`, docs/rewards.md).

A row (jsonl, json, parquet or arrow) holds one prompt and two responses to it:

    {"prompt": "What is 2 + 3?", "chosen": "2 + 3 = 5 ...", "rejected": "2 + 3 = 6 ..."}

`prompt` is a string (one user message) or chat messages `[{"role", "content"}, ...]`;
`messages` may stand instead of it, as in `jaxrl-llm score`'s rows (when both are given,
`messages` is the conversation scored: `data.examples.row_conversation`, the rule reward
models apply too). Neither may be empty. `chosen` is the preferred response, `rejected` the
other. Every other field is kept and ignored. A malformed row stops the read with one line
naming its file and row (`BadPreferenceRow`).

`builtin_preferences` makes pairs from the built-in arithmetic task: the task's worked
solution is chosen; the same solution whose boxed answer is replaced by a wrong number is
rejected (so the preference is "the final answer follows from the working").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.examples import row_conversation
from jaxrl_llm.data.sources import SourceConfig, read_records, require_source
from jaxrl_llm.data.tasks import arithmetic

PAIR_FIELDS = {
    "prompt": "the question: a str, or chat messages [{'role', 'content'}, ...]",
    "messages": "the conversation before the response, instead of prompt (wins over it)",
    "chosen": "the preferred response (str)",
    "rejected": "the other response (str)",
}


class BadPreferenceRow(ConfigError):
    """A preference row that cannot be trained on: its file, row and what is wrong."""


def check_pair(row: Any, where: str) -> dict[str, Any]:
    """`row` unchanged when it is a preference pair, else `BadPreferenceRow` naming `where`."""
    if not isinstance(row, Mapping):
        raise BadPreferenceRow(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in ("chosen", "rejected"):
        if not isinstance(row.get(name), str):
            raise BadPreferenceRow(f"{where}: no '{name}' string (fields: {sorted(row)})")
    try:
        row_conversation(row)
    except ValueError as e:
        raise BadPreferenceRow(f"{where}: {e}") from None
    return dict(row)


def read_preferences(path: str, field: str = "RMConfig.train_file") -> list[dict[str, Any]]:
    """Every row of `path` as a checked pair; the first bad row raises."""
    require_source(path, field)
    rows = []
    for record in read_records(SourceConfig(path)):
        where = f"{record.source}: row {record.line}"
        if record.row is None:
            raise BadPreferenceRow(f"{where}: {record.error}")
        rows.append(check_pair(record.row, where))
    if not rows:
        raise BadPreferenceRow(f"{path}: no preference pairs")
    return rows


def wrong_answer(answer: int, rng: np.random.Generator) -> int:
    """A nearby wrong non-negative integer: `answer` moved by 1 to 9 either way."""
    while True:
        wrong = answer + int(rng.choice([-1, 1])) * int(rng.integers(1, 10))
        if wrong >= 0 and wrong != answer:
            return wrong


def builtin_preferences(
    n: int, *, seed: int = 0, levels: tuple[int, ...] = (1, 2), split: str = "train"
) -> list[dict[str, Any]]:
    """`n` pairs from the arithmetic task's `split`: its worked solution chosen, the same
    solution with a wrong boxed answer rejected."""
    problems = arithmetic.generate_problems(
        n, seed=seed, levels=levels, id_prefix="pref", split=split
    )
    rng = np.random.default_rng(seed)
    pairs = []
    for p in problems:
        boxed = f"\\boxed{{{p['answer']}}}"
        wrong = f"\\boxed{{{wrong_answer(int(p['answer']), rng)}}}"
        pairs.append(
            {
                "id": p["id"],
                "prompt": p["prompt"],
                "chosen": p["solution"],
                "rejected": p["solution"].replace(boxed, wrong),
            }
        )
    return pairs


__all__ = [
    "PAIR_FIELDS",
    "BadPreferenceRow",
    "builtin_preferences",
    "check_pair",
    "read_preferences",
    "wrong_answer",
]

"""`jaxrl-llm score`: each response in a data file scored by a reward, one JSON line per row.

    jaxrl-llm score --reward math --data responses.jsonl
    jaxrl-llm score --reward rm:/models/Skywork-Reward --data responses.jsonl \\
        --gin_param 'RewardModelConfig.normalize = "sigmoid"'
    jaxrl-llm score --data responses.jsonl --gin_param 'RewardConfig.weights = {...}'

The reward is any `RewardConfig.name`: a registered name, `package.module:function`,
`rm:<folder>` or `judge:<folder>`; without `--reward`, the gin-configured `RewardConfig`
(e.g. its `weights`).
A row (jsonl, json, parquet or arrow; `ROW_FIELDS`) needs `response` and a non-empty prompt:
`prompt` (a string or chat messages) or `messages` (`[{"role", "content"}, ...]`; the
conversation a reward model reads when both are given: `data.examples.row_conversation`,
the rule `jaxrl-llm rm` applies too); every other field (`answer`, the ground truth the rule
rewards read, and any column a reward of yours reads) reaches the reward as the data row.
A malformed row stops the command before anything is scored, with one line naming its file
and row. Output, in row order:
`{"row": 3, "id": ..., "score": 0.75}` (`id` when the row has one; `parts`, each reward's
unweighted score, when several are combined; `verdicts`, each judge's text; `error` when
the reward raised, timed out or returned NaN, inf or a non-number on it, the score then being
`RewardConfig.incorrect`, and the exit status 1). Every line is strict JSON (never NaN).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from typing import Any

from jaxrl_llm.config import add_gin_arguments, parse_gin
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.examples import last_user_message, row_conversation
from jaxrl_llm.data.sources import SourceConfig, read_records, require_source

ROW_FIELDS = {
    "response": "the text to score (str)",
    "prompt": "the question: a str, or chat messages [{'role', 'content'}, ...]",
    "messages": "the conversation before the response, instead of (or beside) prompt",
    "answer": "the ground truth, for rewards that read it (math, exact_match, ...)",
}


class BadScoreRow(ConfigError):
    """A data row `score` cannot score: its file, row and what is wrong."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reward",
        default=None,
        help="a reward name, 'package.module:function', 'rm:<reward model folder>' or "
        "'judge:<LLM folder>' "
        "(default: the gin-configured RewardConfig)",
    )
    fields = "; ".join(f"{k}: {v}" for k, v in ROW_FIELDS.items())
    parser.add_argument("--data", required=True, help=f"jsonl/json/parquet rows; {fields}")
    add_gin_arguments(parser)


def check_row(row: Any, where: str) -> dict[str, Any]:
    """The row as a reward receives it (a `prompt` set from the last user message when only
    `messages` is given), or `BadScoreRow` naming `where` and the problem."""
    if not isinstance(row, Mapping):
        raise BadScoreRow(f"{where}: expected a JSON object, got {type(row).__name__}")
    if not isinstance(row.get("response"), str):
        raise BadScoreRow(f"{where}: no 'response' string (fields: {sorted(row)})")
    try:
        chat = row_conversation(row)  # the rule `rm` and reward models apply
    except ValueError as e:
        raise BadScoreRow(f"{where}: {e}") from None
    out = dict(row)
    if not isinstance(row.get("prompt"), str):
        out["prompt"] = last_user_message(chat) or ""
        out.setdefault("messages", chat)
    return out


def read_rows(path: str) -> list[tuple[int, dict[str, Any]]]:
    """(row number, checked row) for every row of `path`; the first bad one raises."""
    require_source(path, "--data")
    rows = []
    for record in read_records(SourceConfig(path)):
        where = f"{record.source}: row {record.line}"
        if record.row is None:
            raise BadScoreRow(f"{where}: {record.error}")
        rows.append((record.line, check_row(record.row, where)))
    if not rows:
        raise ConfigError(f"--data {path}: no row to score (the file is empty)")
    return rows


def score_rows(reward_name: str | None, path: str) -> list[dict[str, Any]]:
    """One output record per row of `path`, scored by `reward_name` (None: the gin-bound
    `RewardConfig`) in one call, so `RewardModelConfig.normalize = "whiten"` spans the file."""
    from jaxrl_llm.rewards.config import RewardConfig, build_rewards, check_rewards
    from jaxrl_llm.rewards.registry import score_error
    from jaxrl_llm.rollout.judge import build_judge

    rows = read_rows(path)
    try:  # a wrong name or folder: one line, before a worker starts or a model loads
        cfg = RewardConfig(name=reward_name, weights=None) if reward_name else RewardConfig()
        check_rewards(cfg, field="--reward" if reward_name else None)
    except ConfigError:
        raise
    except (KeyError, ValueError, TypeError, ImportError, AttributeError) as e:
        raise ConfigError(f"--reward {reward_name!r}: {e}") from e
    with build_rewards(cfg, judges=build_judge) as reward:
        examples = [row for _, row in rows]
        scores = reward.score([row["response"] for row in examples], examples)
        failures = dict(getattr(reward, "last_failures", {}))
        parts = dict(getattr(reward, "last_parts", {}))
        verdicts = dict(getattr(reward, "last_verdicts", {}))
    out = []
    for i, ((line, row), score) in enumerate(zip(rows, scores, strict=True)):
        record: dict[str, Any] = {"row": line, "score": float(score)}
        # The pool and `ModelAndRuleRewards` fail such a sample themselves; this holds any
        # other scorer to the same rule (`registry.score_error`), so the line stays JSON.
        name, fix = " + ".join(cfg.rewards()), "the row scores RewardConfig.incorrect"
        error = score_error(name, float(score), where=f" on row {line}", fix=fix)
        if error is not None and i not in failures:
            failures[i] = f"error: {type(error).__name__}: {error}"
            record["score"] = cfg.incorrect
        if "id" in row:
            record["id"] = row["id"]
        if len(parts) > 1:
            record["parts"] = {name: _number(part.scores[i]) for name, part in parts.items()}
        if verdicts:
            record["verdicts"] = {name: texts[i] for name, texts in verdicts.items()}
        if i in failures:
            record["error"] = str(failures[i])
        out.append(record)
    return out


def _number(x) -> float | None:
    """A part's score for JSON: None where it has none (NaN: timed out or raised)."""
    return float(x) if math.isfinite(x) else None


def main(args: argparse.Namespace) -> int:
    parse_gin(args.gin_file, args.gin_param)
    records = score_rows(args.reward, args.data)
    for record in records:
        print(json.dumps(record, allow_nan=False), flush=True)
    return 1 if any("error" in r for r in records) else 0

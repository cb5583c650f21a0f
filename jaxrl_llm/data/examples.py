"""Field mapping: raw rows -> normalized examples ``{"id", "prompt", "answer", ...}``.

Every source speaks its own column names (MATH: ``problem``/``solution``; GSM8K:
``question``/``answer``; LIMR: ``prompt``/``answer``; verl parquet: ``prompt`` as chat
messages and ``reward_model.ground_truth``). ``FieldMap`` lists, for each normalized field,
the candidate keys tried in order; a dotted key reads a nested field.

The normalized example holds:

- ``id`` (str): the row's id field, or ``"<file name>:<line>"`` when it has none (so the same
  file always yields the same ids; LIMR's scores and selections rely on that); an element of
  a JSON array that starts on the same line as another (``json.dump(rows, f)`` writes the
  whole array on one line) is ``"<file name>[<its 0-based position in the array>]"``. The
  file name is the base name, except in a dataset folder where several files of the split
  share it (``train/en/data.jsonl``, ``train/fr/data.jsonl``): there it is the path relative
  to the folder, so their rows do not collide as duplicate ids.
- ``prompt`` (str): the question. When the prompt field holds chat messages (a list of
  ``{"role", "content"}``), ``prompt`` is the last user message and ``messages`` holds the
  conversation up to and including the last turn that is not the assistant's: trailing
  assistant turns (a worked solution, as in NuminaMath-CoT's and OpenR1-Math's ``messages``)
  are dropped, so the policy is never shown them.
- ``answer`` (str, or list of str for datasets with several accepted answers); integers and
  floats are converted with ``str``; a blank answer or list entry is malformed.
- every other top-level field of the row, unchanged (passthrough), except a raw ``messages``
  column: ``messages`` is set only from the prompt field, so a dataset's ``messages`` beside
  its ``problem`` (often the problem *and its solution*) never becomes the prompt. To prompt
  with such a column, name it: ``FieldMap(prompt=("messages",))``
  (``DataConfig.prompt_key = "messages"``).

Malformed rows (unparseable, missing or blank prompt or answer, prompt messages with no user
turn, wrong types, duplicate id) are skipped, counted and logged with their file and line,
or, with ``strict=True``, raise ``MalformedRowError`` naming the line. All of it happens
when the pipeline is built, so a bad row can never stop a run midway.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from jaxrl_llm.data.sources import RawRecord, SourceConfig, read_records

log = logging.getLogger(__name__)

_MISSING = object()
_LOGGED_BAD_ROWS = 20


@dataclasses.dataclass(frozen=True)
class FieldMap:
    """Candidate keys for each normalized field, tried in order (dots read nested fields)."""

    prompt: tuple[str, ...] = ("prompt", "question", "problem")
    answer: tuple[str, ...] = ("answer", "solution", "ground_truth", "reward_model.ground_truth")
    id: tuple[str, ...] = ("id",)


DEFAULT_FIELDS = FieldMap()


class MalformedRowError(ValueError):
    """A row that cannot become an example, raised in strict mode."""


@dataclasses.dataclass(frozen=True)
class BadRow:
    """Where a skipped row is and why it was skipped."""

    source: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}"


@dataclasses.dataclass
class DataReport:
    """What building a dataset kept and dropped.

    Attributes:
      rows_read: rows seen in the source (malformed ones included; blank lines not).
      malformed: the skipped rows with file, line and reason.
      too_long: ids of prompts dropped for being longer than ``max_prompt_length`` tokens.
      kept: examples that made it into the dataset.
    """

    rows_read: int = 0
    malformed: list[BadRow] = dataclasses.field(default_factory=list)
    too_long: list[str] = dataclasses.field(default_factory=list)
    kept: int = 0

    def summary(self) -> str:
        return (
            f"{self.kept} prompts kept of {self.rows_read} rows read; "
            f"{len(self.malformed)} malformed rows skipped; "
            f"{len(self.too_long)} prompts filtered as too long"
        )

    def as_metrics(self) -> dict[str, float]:
        """Counts under metric names, for the run's metrics log."""
        return {
            "data/rows_read": float(self.rows_read),
            "data/malformed_rows": float(len(self.malformed)),
            "data/filtered_too_long": float(len(self.too_long)),
            "data/prompts": float(self.kept),
        }


def get_field(row: dict[str, Any], key: str) -> Any:
    """``row[key]``, following dots into nested dicts; ``_MISSING`` when absent."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _first_field(row: dict[str, Any], keys: Iterable[str]) -> tuple[str | None, Any]:
    for key in keys:
        value = get_field(row, key)
        if value is not _MISSING and value is not None:
            return key, value
    return None, _MISSING


def _as_text(value: Any) -> str | None:
    """Answers may be strings or plain numbers; anything else is not an answer."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(value)
    return None


def _normalize_prompt(value: Any) -> tuple[str, list[dict[str, str]] | None]:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("empty prompt")
        return value, None
    if isinstance(value, list) and value:
        messages = _prompt_turns(value)
        question = last_user_message(messages)
        if not question or not question.strip():
            raise ValueError("prompt messages have no non-empty user message")
        return question, messages
    raise ValueError(f"prompt must be a string or chat messages, got {value!r:.60}")


def _prompt_turns(value: list[Any]) -> list[dict[str, str]]:
    """Chat messages as the policy's prompt: checked, and cut after the last turn that is not
    the assistant's (trailing assistant turns answer the question: a reference solution)."""
    messages = []
    for message in value:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ValueError("prompt messages must be {'role': str, 'content': str}")
        messages.append({"role": message["role"], "content": message["content"]})
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    return messages


def last_user_message(messages: Any) -> str | None:
    """The content of the last `{"role": "user", "content": str}` of chat `messages` (the
    question a row asks); None when there is none."""
    if not isinstance(messages, list):
        return None
    users = [
        m["content"]
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
    ]
    return users[-1] if users else None


def row_conversation(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The conversation before the response in a row to score (`jaxrl-llm score`, `jaxrl-llm
    rm`'s pairs, a reward model's input): the row's `messages` when present, else its `prompt`
    (a string as one user message, or chat messages). One rule for all three, so a row that
    passes the commands' checks is the row a reward model reads. Each of the two present must
    be non-empty (a string with text, a non-empty list of `{"role", "content": str}`); a
    `ValueError` says which is not."""
    messages, prompt = row.get("messages"), row.get("prompt")
    if messages is None and prompt is None:
        raise ValueError(f"no 'prompt' or 'messages' (fields: {sorted(row)})")
    # `prompt` is checked even where `messages` wins: a malformed column is a malformed row.
    chat = [] if prompt is None else _scored_turns(prompt, "the prompt", text_ok=True)
    if messages is not None:
        chat = _scored_turns(messages, "'messages'", text_ok=False)
    return chat


def _scored_turns(value: Any, name: str, *, text_ok: bool) -> list[dict[str, str]]:
    if text_ok and isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{name} is empty")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not all(
        isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in value
    ):
        raise ValueError(
            f"{name} must be {'a string or ' * text_ok}a list of "
            "{'role': str, 'content': str} messages"
        )
    if not value:
        raise ValueError(f"{name} is an empty list: it holds the conversation before the response")
    return [{"role": str(m.get("role", "user")), "content": m["content"]} for m in value]


def _normalize_answer(value: Any) -> str | list[str]:
    """The answer as text, or a list of accepted answers; blank ones are refused (a reward
    would score every sample of the row wrong, as for an empty prompt)."""
    text = _as_text(value)
    if text is not None:
        if not text.strip():
            raise ValueError("empty answer")
        return text
    if isinstance(value, list) and value:
        texts = [_as_text(v) for v in value]
        if all(t is not None for t in texts):
            if not all(t.strip() for t in texts if t is not None):
                raise ValueError(f"empty answer in the list of answers {value!r:.60}")
            return [t for t in texts if t is not None]
    raise ValueError(f"answer must be a string, a number or a list of them, got {value!r:.60}")


def normalize_row(row: dict[str, Any], fields: FieldMap, *, default_id: str) -> dict[str, Any]:
    """Maps one raw row to a normalized example; raises ``ValueError`` saying what is wrong."""
    prompt_key, prompt_value = _first_field(row, fields.prompt)
    if prompt_key is None:
        hint = ""
        if "messages" in row:
            hint = (
                "; a 'messages' column is the prompt only when named as the prompt field "
                "(DataConfig.prompt_key = 'messages')"
            )
        raise ValueError(f"no prompt field (looked for {', '.join(fields.prompt)}){hint}")
    answer_key, answer_value = _first_field(row, fields.answer)
    if answer_key is None:
        raise ValueError(f"no answer field (looked for {', '.join(fields.answer)})")
    id_key, id_value = _first_field(row, fields.id)
    if id_key is None:
        example_id = default_id
    elif isinstance(id_value, str | int) and not isinstance(id_value, bool):
        example_id = str(id_value)
    else:
        raise ValueError(f"id must be a string or an integer, got {type(id_value).__name__}")
    prompt, messages = _normalize_prompt(prompt_value)
    answer = _normalize_answer(answer_value)

    # `messages` comes only from the prompt field: a raw column would become the prompt.
    consumed = {key for key in (prompt_key, answer_key, id_key) if key and "." not in key}
    consumed.add("messages")
    example = {k: v for k, v in row.items() if k not in consumed}
    example.update(id=example_id, prompt=prompt, answer=answer)
    if messages is not None:
        example["messages"] = messages
    return example


def default_id(record: RawRecord) -> str:
    """The id given to a row without an id field: ``"<file name>:<line>"``, or, for an
    element of a JSON array that shares its line with another (``RawRecord.element``),
    ``"<file name>[<position in the array>]"``. The file name is the base name, or
    ``RawRecord.name`` (the path within a dataset folder) where other files of the split share
    that base name. Line ids stay as they were for every row that has a line and a file name of
    its own: resumed runs' data fingerprints and LIMR's records hold them."""
    name = record.name or Path(record.source).name
    if record.element is not None:
        return f"{name}[{record.element}]"
    return f"{name}:{record.line}"


def iter_examples(
    records: Iterable[RawRecord],
    fields: FieldMap,
    report: DataReport,
    *,
    strict: bool = False,
) -> Iterator[tuple[RawRecord, dict[str, Any]]]:
    """Normalizes ``records``, yielding ``(record, example)`` and filling ``report``."""
    seen: dict[str, BadRow] = {}
    for record in records:
        report.rows_read += 1
        reason = record.error
        example = None
        if reason is None:
            try:
                example = normalize_row(record.row, fields, default_id=default_id(record))
            except ValueError as e:
                reason = str(e)
        if example is not None and example["id"] in seen:
            first = seen[example["id"]]
            reason = f"duplicate id {example['id']!r} (first at {first.source}:{first.line})"
            example = None
        if example is None:
            bad = BadRow(record.source, record.line, reason)
            if strict:
                raise MalformedRowError(str(bad))
            report.malformed.append(bad)
            continue
        seen[example["id"]] = BadRow(record.source, record.line, "")
        yield record, example


def load_examples(
    source: SourceConfig, fields: FieldMap = DEFAULT_FIELDS, *, strict: bool = False
) -> tuple[list[dict[str, Any]], DataReport]:
    """Reads and normalizes every row of ``source``.

    Returns:
      the examples in source order, and a ``DataReport`` (``too_long`` is filled later by the
      pipeline, which knows the tokenizer).

    Raises:
      MalformedRowError: in strict mode, at the first malformed row, naming its line.
    """
    report = DataReport()
    examples = [ex for _, ex in iter_examples(read_records(source), fields, report, strict=strict)]
    report.kept = len(examples)
    log_bad_rows(report)
    return examples, report


def log_bad_rows(report: DataReport) -> None:
    """Logs the malformed rows (the first few in full, then a count)."""
    if not report.malformed:
        return
    log.warning("skipped %d malformed rows:", len(report.malformed))
    for bad in report.malformed[:_LOGGED_BAD_ROWS]:
        log.warning("  %s", bad)
    if len(report.malformed) > _LOGGED_BAD_ROWS:
        log.warning("  ... and %d more", len(report.malformed) - _LOGGED_BAD_ROWS)

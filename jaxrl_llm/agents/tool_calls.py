"""Tool calls read from a model turn, in the format its checkpoint was trained to write.

    turn = parse_turn("qwen", text)      # -> ParsedTurn(content, calls, malformed, reasoning)

A parser is one function `text -> ParsedTurn`, registered by name (`register_parser`), so a
new format is one function. Built-in:

- "qwen" (alias "hermes"): Qwen2.5 / Qwen3 instruct templates, and every template that
  follows the Hermes convention. Each call is a block
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; a turn may hold several.
  Text outside the blocks is the turn's content. A block is the JSON object after the tag
  when the closing tag follows it, so an argument may hold `</tool_call>` (a template's
  `tojson` writes it unescaped); else it ends at the first closing tag.
- "llama3_json": Llama 3.1 / 3.2 with custom (JSON) tools. The whole turn is the call,
  `{"name": ..., "parameters": {...}}` (Meta's docs; "arguments" is taken too), optionally
  after `<|python_tag|>`; several calls are separated by ";" or whitespace. A turn that
  does not start with "{" is plain content (no call).

Reasoning is not a place for calls, in every format: `parse_turn` hands the parser the
turn without its reasoning (`split_reasoning`), as vLLM separates reasoning content (its
reasoning parser) before its tool parser reads what follows. Reasoning is each
`<think>` ... `</think>` block; a `<think>` never closed, to the turn's end (the turn ended,
or was cut, while the model thought); and, where the template's generation prompt ends
with `<think>` (`prompt_opens_reasoning`; Qwen3-Thinking-2507, DeepSeek-R1), the text before
the turn's first `<think>` up to a `</think>`. So a `<tool_call>` drafted while thinking is
not run; one after `</think>` is. Without a `<think>` in the generation prompt, a
`</think>` that closes nothing is plain text (an argument may hold it); with one, a call
that such a `</think>` cuts (an unfinished call before it) is malformed, never dropped.
The rule is the same for every format, since the tags are the reasoning models' own,
whatever format they call tools in (DeepSeek-R1's Qwen and Llama distillations, Qwen3); a
turn without the tags is unchanged. Other reasoning markup (gpt-oss's channels) is not
read as reasoning.

`arguments` may arrive as an object or as a JSON string of one (OpenAI's wire form); both
become a dict. What cannot be read as a call (bad JSON, no name, arguments not an object, an
unclosed block) becomes a `MalformedCall` with the reason: the environment answers it with
an error observation and counts it; it never raises, also on JSON that Python's decoder
cannot read (nesting past the recursion limit, an integer past the int-from-str digit limit).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class MalformedCall:
    """Text that was meant as a call but cannot be one, and why."""

    text: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """A model turn: its text outside the calls and the reasoning, its calls in order, what
    was malformed, and its reasoning (the think blocks' text, joined by newlines)."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    malformed: tuple[MalformedCall, ...] = ()
    reasoning: str = ""


class HasCalls(Protocol):
    """What answering a turn's calls reads: a `ParsedTurn` or an environment's `Turn`."""

    @property
    def calls(self) -> tuple[ToolCall, ...]: ...

    @property
    def malformed(self) -> tuple[MalformedCall, ...]: ...


Parser = Callable[[str], ParsedTurn]
PARSERS: dict[str, Parser] = {}


def register_parser(*names: str) -> Callable[[Parser], Parser]:
    """Register a parser under one or more format names (a decorator)."""

    def add(fn: Parser) -> Parser:
        for name in names:
            PARSERS[name] = fn
        return fn

    return add


def parse_turn(fmt: str, text: str, *, prompt_opens_reasoning: bool = False) -> ParsedTurn:
    """The calls in `text` as format `fmt` writes them, outside its reasoning.
    `prompt_opens_reasoning`: the chat template's generation prompt ends with `<think>`
    (`ChatFormat.opens_reasoning`), so the text up to the first `</think>` is reasoning too."""
    try:
        parser = PARSERS[fmt]
    except KeyError:
        raise ValueError(
            f"tool-call format {fmt!r}: expected one of {', '.join(sorted(PARSERS))} "
            "(add one with jaxrl_llm.agents.register_parser)"
        ) from None
    head, text = _prompt_block(text) if prompt_opens_reasoning else (None, text)
    reasoning, rest = split_reasoning(text)
    parsed = parser(rest)
    if head is not None:
        reasoning.insert(0, head)
        cut = _cut_calls(parser, head)
        parsed = dataclasses.replace(parsed, malformed=(*cut, *parsed.malformed))
    if not reasoning:
        return parsed
    return dataclasses.replace(parsed, reasoning="\n".join(r.strip() for r in reasoning))


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str, *, prompt_opens_reasoning: bool = False) -> tuple[list[str], str]:
    """(The reasoning blocks of a turn, the turn without them), as the module docstring
    says: each `<think>` ... `</think>`, an unclosed `<think>` to the end, and, where the
    generation prompt opened a `<think>` (`prompt_opens_reasoning`), the text up to a
    `</think>` that comes before any `<think>`. Tags that open or close nothing (a second
    `</think>`) stay in the rest."""
    head, text = _prompt_block(text) if prompt_opens_reasoning else (None, text)
    blocks: list[str] = [] if head is None else [head]
    rest: list[str] = []
    while True:
        before, opened, after = text.partition(THINK_OPEN)
        rest.append(before)
        if not opened:
            return blocks, "".join(rest)
        inside, closed, text = after.partition(THINK_CLOSE)
        blocks.append(inside)
        if not closed:
            return blocks, "".join(rest)


def _prompt_block(text: str) -> tuple[str | None, str]:
    """(The reasoning the generation prompt opened: the text up to the first `</think>`
    when no `<think>` comes before it, else None; the text after it)."""
    head, closed, tail = text.partition(THINK_CLOSE)
    return (head, tail) if closed and THINK_OPEN not in head else (None, text)


def _cut_calls(parser: Parser, head: str) -> list[MalformedCall]:
    """The call that the `</think>` ending `head` cut (a `</think>` inside its arguments),
    as malformed: a malformed call the parser reads to the head's end. Whole calls drafted
    in the reasoning stay drafts, not run and not counted, as in a `<think>` block."""
    end = head.rstrip()
    return [
        MalformedCall(
            bad.text + THINK_CLOSE,
            f"{THINK_CLOSE} inside the call ends the reasoning the prompt opened ({bad.reason})",
        )
        for bad in parser(head).malformed
        if bad.text.strip() and end.endswith(bad.text.rstrip())
    ]


# What Python's json raises on text it cannot read: a `JSONDecodeError` (a `ValueError`) for
# bad JSON, a plain `ValueError` for an integer past the int-from-str digit limit (4,300),
# a `RecursionError` for nesting deeper than the interpreter's recursion limit.
_UNREADABLE = (ValueError, RecursionError)


def _why(e: Exception) -> str:
    """The reason of a json failure, for the model: json's message without its position,
    or the first clause of Python's (not its advice on raising the interpreter's limit)."""
    if isinstance(e, json.JSONDecodeError):
        return e.msg
    return "nested too deeply" if isinstance(e, RecursionError) else str(e).split(":")[0]


def read_call(obj: Any, text: str, args_key: str = "arguments") -> ToolCall | MalformedCall:
    """A decoded JSON value as a call `{"name": str, args_key: object}`, or why it is not."""
    if not isinstance(obj, dict):
        return MalformedCall(text, f"a call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(text, 'a call needs a "name" string')
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):  # OpenAI's wire form: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except _UNREADABLE as e:
            return MalformedCall(text, f"arguments are not JSON: {_why(e)}")
    if not isinstance(args, dict):
        return MalformedCall(text, f"arguments must be an object, got {type(args).__name__}")
    return ToolCall(name, args)


def _split(found: list[ToolCall | MalformedCall]) -> tuple[tuple, tuple]:
    calls = tuple(c for c in found if isinstance(c, ToolCall))
    return calls, tuple(c for c in found if isinstance(c, MalformedCall))


_QWEN_OPEN, _QWEN_CLOSE = "<tool_call>", "</tool_call>"
# Markup the parsers read, kept in a turn's text also where the tokenizer makes it a special
# token (`ChatFormat` removes the other special tokens).
PARSER_MARKUP = (THINK_OPEN, THINK_CLOSE, _QWEN_OPEN, _QWEN_CLOSE)
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _after_space(text: str, i: int) -> int:
    m = _SPACE.match(text, i)
    return m.end() if m else i


def _qwen_block(text: str, start: int) -> tuple[str, int, bool]:
    """(The body of the block opened at `start`, the index after the block, whether it is
    closed). The body is the JSON object after the tag when the closing tag follows it, so
    a closing tag inside a string argument (as `tojson` writes it) is the argument's; else
    the text up to the first closing tag, or to the end."""
    body_at = start + len(_QWEN_OPEN)
    brace = _after_space(text, body_at)
    if text.startswith("{", brace):
        try:
            _, end = _DECODER.raw_decode(text, brace)
        except _UNREADABLE:
            pass
        else:
            close = _after_space(text, end)
            if text.startswith(_QWEN_CLOSE, close):
                return text[body_at:close], close + len(_QWEN_CLOSE), True
    close = text.find(_QWEN_CLOSE, body_at)
    if close < 0:
        return text[body_at:], len(text), False
    return text[body_at:close], close + len(_QWEN_CLOSE), True


@register_parser("qwen", "hermes")
def parse_qwen(text: str) -> ParsedTurn:
    found: list[ToolCall | MalformedCall] = []
    outside: list[str] = []
    i = 0
    while (start := text.find(_QWEN_OPEN, i)) >= 0:
        outside.append(text[i:start])
        raw, i, closed = _qwen_block(text, start)
        body = raw.strip()
        if not closed:
            found.append(MalformedCall(text[start:], "unclosed <tool_call> block"))
            continue
        try:
            found.append(read_call(json.loads(body), body))
        except _UNREADABLE as e:
            found.append(MalformedCall(body, f"not JSON: {_why(e)}"))
    outside.append(text[i:])
    calls, malformed = _split(found)
    return ParsedTurn("".join(outside).strip(), calls, malformed)


_PYTHON_TAG = "<|python_tag|>"


@register_parser("llama3_json")
def parse_llama3_json(text: str) -> ParsedTurn:
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    if not body.startswith("{"):
        return ParsedTurn(text.strip())
    decoder, found, i = json.JSONDecoder(), [], 0
    while i < len(body):
        try:
            obj, end = decoder.raw_decode(body, i)
        except _UNREADABLE as e:
            found.append(MalformedCall(body[i:], f"not JSON: {_why(e)}"))
            break
        found.append(read_call(obj, body[i:end], args_key="parameters"))
        i = end
        while i < len(body) and (body[i].isspace() or body[i] == ";"):
            i += 1
    calls, malformed = _split(found)
    return ParsedTurn("", calls, malformed)

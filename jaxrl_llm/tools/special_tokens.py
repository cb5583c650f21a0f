"""Text from outside the model that must tokenise as plain text, and how an observation is
encoded: `encode_observation`, the one function both sampler backends call.

A tokenizer called with its defaults turns a special token's string ("<|im_end|>") found in
its text into that control token, so a program that prints "<|im_end|>", a retrieved
passage or a tool's answer that holds "<|im_start|>assistant" would end a turn or open a
forged one. Hence:

- `encode_observation(tokenizer, observation)`: what a tool returned, as the ids the sampler
  appends. A `str` is plain text: special-token strings in it are ordinary characters
  (`split_special_tokens=True`). An `Observation` (a `str` whose parts say which text is
  markup) keeps the special tokens of its markup parts: a chat template's own turn markers
  around `tool` messages. A plain part never yields a special id: a vocabulary whose merges
  spell a special token from its characters gets the text neutralised first (below). Text
  without special-token strings encodes exactly as the tokenizer's default call does.
- `mark_special_tokens` / `Observation.from_marked`: how `agents.chat.ChatFormat` tells the
  template's markers from the tool messages' text after rendering both into one string
  (transformers' `apply_chat_template(sanitize_control_tokens=True)` does the same for whole
  chats): each special-token string in the messages' strings is wrapped in two
  private-use characters (markers in the strings are dropped first, so none can be forged),
  the template renders them, and every wrapped string becomes a plain part. What is not
  guarded: a template that cuts a message's text apart (slices it) can part a marker from
  its token; the lone marker is dropped but still parts the text, and such a token reads
  as the template's own.
- `neutralise_special_tokens`: for texts that are not encoded here (an LLM judge's rendered
  chat, the built-in tools' outputs, which other readers also see as text): a zero-width
  space (U+200B) goes after the first character of each special token's string, which then
  tokenises as ordinary characters and still reads the same to a model.

Special tokens are the tokenizer's special ones (`special_token_strings`). Added tokens that
are not special (Qwen's `<tool_call>`, Qwen3's `<think>`) are matched as the tokenizer
always matches them, also in the model's own writing: they neither end a turn nor open one.
"""

from __future__ import annotations

import copy
import re
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ZERO_WIDTH_SPACE = "\u200b"
# Private-use characters (plane 15) around a special-token string in a template's input:
# the ones transformers' `mark_control_tokens` uses.
MARK_START, MARK_END = "\U000f0000", "\U000f0001"


def special_token_strings(tokenizer) -> tuple[str, ...]:
    """The strings `tokenizer` reads as special tokens (its special added tokens and named
    special tokens), longest first; () for None or a tokenizer that declares none."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found |= {t.content for t in decoder.values() if getattr(t, "special", False)}
    return tuple(sorted((s for s in found if len(s) > 1), key=lambda s: (-len(s), s)))


def neutralise_special_tokens(text: str, specials: Sequence[str]) -> str:
    """`text` with a zero-width space after the first character of every occurrence of a
    string of `specials`, so none is left (each pass breaks at least one occurrence and
    creates none, so the loop ends)."""
    if not specials or not text:
        return text
    pattern = _alternatives(specials)
    while pattern.search(text):
        text = pattern.sub(lambda m: m[0][0] + ZERO_WIDTH_SPACE + m[0][1:], text)
    return text


def _alternatives(specials: Sequence[str]) -> re.Pattern[str]:
    """A pattern of any of `specials`, the longest first where several match."""
    ordered = sorted(specials, key=len, reverse=True)
    return re.compile("|".join(re.escape(s) for s in ordered) or "(?!)")


class Observation(str):
    """An observation in parts `(text, markup)`: markup (a chat template's own text) keeps
    its special tokens when encoded, the rest is plain text. Its string is the whole text;
    a string operation on it gives a plain `str`, encoded as plain text throughout."""

    parts: tuple[tuple[str, bool], ...]

    def __new__(cls, parts: Iterable[tuple[str, bool]]) -> Observation:
        kept = tuple((text, bool(markup)) for text, markup in parts if text)
        obs = super().__new__(cls, "".join(text for text, _ in kept))
        obs.parts = kept
        return obs

    @classmethod
    def from_marked(cls, text: str, specials: Sequence[str]) -> Observation:
        """`text`, rendered from values `mark_special_tokens` marked: each marked special
        token's string is a plain part (its markers dropped), the rest markup. A lone
        marker is dropped but parts the text, so the text on its two sides cannot join
        into a special token."""
        found = re.compile(f"{MARK_START}({_alternatives(specials).pattern}){MARK_END}"
                           f"|[{MARK_START}{MARK_END}]")  # fmt: skip
        parts: list[tuple[str, bool]] = []
        at = 0
        for m in found.finditer(text):
            parts.append((text[at : m.start()], True))
            if m[1] is not None:
                parts.append((m[1], False))
            at = m.end()
        parts.append((text[at:], True))
        return cls(parts)


def mark_special_tokens(value: Any, specials: Sequence[str]) -> Any:
    """`value` (a string, or chat messages: dicts and lists of them) with each string of
    `specials` in its strings wrapped in `MARK_START` / `MARK_END`, the markers already in
    them dropped first; dict keys and other values unchanged."""
    if isinstance(value, str):
        value = value.replace(MARK_START, "").replace(MARK_END, "")
        return _alternatives(specials).sub(lambda m: MARK_START + m[0] + MARK_END, value)
    if isinstance(value, Mapping):
        return {k: mark_special_tokens(v, specials) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mark_special_tokens(v, specials) for v in value]
    return value


def encode_observation(tokenizer: Any, observation: str) -> list[int]:
    """The ids a sampler appends for `observation` (see the module docstring): a `str` as
    plain text, an `Observation` part by part."""
    plain = ((observation, False),)
    parts = observation.parts if isinstance(observation, Observation) else plain
    ids: list[int] = []
    for text, markup in parts:
        if markup:
            ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids += _plain_ids(tokenizer, text)
    return ids


def _plain_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` as plain text: no special token read from it, and none spelled by merges."""
    plain = _plain_tokenizer(tokenizer)
    ids = list(plain(text, add_special_tokens=False)["input_ids"])
    specials = special_token_strings(tokenizer)
    if set(ids) & {tokenizer.convert_tokens_to_ids(s) for s in specials}:
        ids = list(
            plain(neutralise_special_tokens(text, specials), add_special_tokens=False)["input_ids"]
        )
    return ids


_PLAIN: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_PLAIN_LOCK = threading.Lock()


def _plain_tokenizer(tokenizer: Any) -> Any:
    """A copy of `tokenizer` that reads no special token (`split_special_tokens`), made once
    per tokenizer. Not the flag on `tokenizer` itself: transformers sets it on the fast
    tokenizer's shared backend at every call, so a plain encode in one thread (a tool turn)
    could switch it under another thread's encode of a chat prompt (a data or reward
    thread), whose turn markers would then come out as ordinary characters."""
    with _PLAIN_LOCK:
        plain = _PLAIN.get(tokenizer)
        if plain is None:
            plain = copy.deepcopy(tokenizer)
            plain.split_special_tokens = True
            _PLAIN[tokenizer] = plain
        return plain

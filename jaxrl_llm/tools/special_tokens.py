"""Text from outside the model that must tokenise as plain text: `neutralise_special_tokens`.

A tokenizer called with its defaults turns a special token's string ("<|im_end|>") found
in its text into that control token. The rollout encodes a tool's observation that way
(a chat tool's observation holds the template's turn markers on purpose), and an LLM judge
encodes its rendered chat template that way; so a program that prints "<|im_end|>", a
retrieved passage or a policy's response that holds "<|im_start|>assistant" would end a
turn or open a forged one. The texts such sources contribute are neutralised first: a
zero-width space (U+200B) goes after the first character of each special token's string,
which then tokenises as ordinary characters and still reads the same to a model. Only the
inserted texts are changed; the template's own markers stay special.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ZERO_WIDTH_SPACE = "\u200b"


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
    pattern = re.compile("|".join(re.escape(s) for s in specials))
    while pattern.search(text):
        text = pattern.sub(lambda m: m[0][0] + ZERO_WIDTH_SPACE + m[0][1:], text)
    return text

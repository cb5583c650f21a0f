"""Finding the final answer in a model's response.

`extract_answer` tries, in order, the strategies named in `fallbacks`:
  "boxed"       the content of the last \\boxed{...} (or \\fbox{...}), nested braces included;
                also the brace-less form "\\boxed 5";
  "answer_is"   the last "the (final) answer is X" (to the end of its sentence or line);
  "answer_tag"  the content of the last <answer>...</answer>;
  "last_number" the last integer, decimal or simple fraction in the text.
The default is ("boxed",) alone: fallbacks reward answers the prompt did not ask for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

FALLBACKS = ("boxed", "answer_is", "answer_tag", "last_number")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(\{)?")
_ANSWER_IS = re.compile(
    r"(?:final answer|answer)\s*(?:is|:)\s*:?\s*(.+?)(?:\.\s|\.$|\n|$)", re.IGNORECASE
)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces matched; None if none is closed."""
    for match in reversed(list(_BOXED.finditer(text))):
        if match.group(1) is None:  # "\boxed 5": up to the next space or "$"
            rest = re.match(r"([^\s$]+)", text[match.end() :])
            if rest:
                return rest.group(1)
            continue
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            char = text[i]
            if char == "\\":  # skip escaped braces such as \{ and \}
                continue
            if char == "{" and text[i - 1] != "\\":
                depth += 1
            elif char == "}" and text[i - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def last_tag(text: str, tag: str) -> str | None:
    """The content of the last <tag>...</tag>, stripped."""
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


def extract_answer(text: str, fallbacks: Sequence[str] = ("boxed",)) -> str | None:
    """The final answer by the first strategy in `fallbacks` that finds one (or None)."""
    for name in fallbacks:
        if name == "boxed":
            answer = last_boxed(text)
        elif name == "answer_is":
            matches = _ANSWER_IS.findall(text)
            answer = matches[-1].strip().strip("$").strip() if matches else None
        elif name == "answer_tag":
            answer = last_tag(text, "answer")
        elif name == "last_number":
            matches = _NUMBER.findall(text)
            answer = matches[-1].replace(",", "") if matches else None
        else:
            raise ValueError(f"unknown answer fallback {name!r}; choose from {FALLBACKS}")
        if answer:
            return answer
    return None

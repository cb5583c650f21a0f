"""Finding the final answer in a model's response (and in a dataset's gold answer).

`extract_answer` tries, in order, the strategies named in `fallbacks`:
  "boxed"       the content of the last \\boxed{...} (or \\fbox{...}), nested braces included
                (\\{, \\} and a LaTeX line break \\\\ neither open nor close one; a trailing
                line break is dropped: "\\boxed{5\\\\}" -> "5"); also the
                brace-less form "\\boxed 5" (trailing punctuation dropped: "\\boxed 5." -> "5");
                an empty last box (\\boxed{}) is no answer;
  "gsm8k"       what follows the last "####" that starts a line and is followed by an answer
                (a digit, sign, ".", "$", "\\" or "("; a numbered heading such as "#### 1. Setup"
                excluded), so a markdown heading ("#### Step 2", "#### Final Answer") is not
                read as one; thousands separators dropped ("#### 1,200" -> "1200");
  "answer_is"   the last "the (final) answer is X" / "Answer: X" (to the end of its sentence
                or line; "**Answer**: X" too): the first inline math in X when it holds some
                ("$5$ dollars" -> "5"; $...$, \\(...\\), \\[...\\]), else X with surrounding
                "$" and markdown bold "**" removed;
  "answer_tag"  the content of the last <answer>...</answer>;
  "last_number" the last integer, decimal or simple fraction in the text.
Every strategy reads a Unicode minus sign (U+2212, or an en dash opening a number) as "-".
The default, `DEFAULT_FALLBACKS`, is the three explicit final-answer markers (boxed, ####,
"the answer is"); "last_number" is never on by default: it rewards answers the prompt did
not ask for. `gold_answer` reads a dataset's answer field the same way, \\boxed{} first, so
a GSM8K solution ("... #### 72") or a MATH solution ("... \\boxed{72}", markdown "####"
headings and all) compares as "72".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

DEFAULT_FALLBACKS = ("boxed", "gsm8k", "answer_is")
# GSM8K's marker: "#### 72" on its own line. The content must start like an answer and not
# like a numbered heading, so that markdown's level-4 headings are not taken for it.
_GSM8K = re.compile(
    r"^[ \t]*####[ \t]*(?!\d+[.)][ \t]+[A-Za-z])([-+$\\(.\d][^\n]*?)[ \t]*$", re.MULTILINE
)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(\{)?")
# "answer" and "is" / ":" may be apart by markdown bold ("**Answer**: 1/2").
_ANSWER_IS = re.compile(
    r"(?:final answer|answer)\**\s*(?:is|:)\s*\**:?\s*(.+?)(?:\.\s|\.$|\n|$)", re.IGNORECASE
)
# The first inline math of a phrase ("$5$ dollars" -> "5"): $...$, $$...$$, \(...\), \[...\].
_INLINE_MATH = re.compile(r"\$\$?([^$]+?)\$\$?|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# U+2212 MINUS SIGN, and an en dash opening a number ("–5", not the range "3–5"), as "-".
_MINUS = re.compile(r"\u2212|(?<![\w.])\u2013(?=\.?\d)")
_TRAILING_LINE_BREAKS = re.compile(r"(?:\s*\\\\)+\s*$")  # "5 \\" in a box: layout, not answer
_ANSWER_WRAPPING = re.compile(r"^[\s$*]+|[\s$*]+$")  # "$x$", "**x**" (markdown bold)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def ascii_minus(text: str) -> str:
    """`text` with a Unicode minus sign written as "-" (`_MINUS`), so that "−5" reads as -5."""
    return _MINUS.sub("-", text)


def answer_phrase(text: str) -> str | None:
    """The last "the answer is X" / "Answer: X" phrase: the first inline math in it when it
    holds some ("$5$ dollars" -> "5"), else the phrase without surrounding "$" and "**"."""
    matches = _ANSWER_IS.findall(text)
    if not matches:
        return None
    math = _INLINE_MATH.search(matches[-1])
    if math:
        return next(g for g in math.groups() if g is not None).strip()
    return _ANSWER_WRAPPING.sub("", matches[-1])


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces matched; None if none is closed."""
    for match in reversed(list(_BOXED.finditer(text))):
        if match.group(1) is None:  # "\boxed 5": up to the next space or "$"
            rest = re.match(r"([^\s$]+)", text[match.end() :])
            answer = rest.group(1).rstrip(".,;:!?") if rest else ""
            if answer:
                return answer
            continue
        content = _braced(text, match.end())
        if content is not None:
            return _TRAILING_LINE_BREAKS.sub("", content)
    return None


def _braced(text: str, start: int) -> str | None:
    """`text` from `start` to the "}" closing a group opened just before it, stripped; None
    if unclosed. A backslash and the character after it (\\{, \\}, a line break \\\\)
    never open or close a group."""
    depth, i = 1, start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
        i += 1
    return None


def last_tag(text: str, tag: str) -> str | None:
    """The content of the last <tag>...</tag>, stripped."""
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


def last_gsm8k(text: str) -> str | None:
    """What follows the last GSM8K marker ("####" starting a line and followed by an answer,
    not a markdown heading), thousands separators dropped; None if none."""
    matches = [m for m in _GSM8K.findall(text) if m.strip()]
    return _THOUSANDS.sub("", matches[-1]).strip().rstrip(".") if matches else None


def last_number(text: str) -> str | None:
    """The last integer, decimal or simple fraction in the text (thousands separators
    dropped); None if none."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


# Each strategy of `fallbacks` by its name (`FALLBACKS`, the order the docs list them in).
STRATEGIES: dict[str, Callable[[str], str | None]] = {
    "boxed": last_boxed,
    "gsm8k": last_gsm8k,
    "answer_is": answer_phrase,
    "answer_tag": lambda text: last_tag(text, "answer"),
    "last_number": last_number,
}
FALLBACKS = tuple(STRATEGIES)


def extract_answer(text: str, fallbacks: Sequence[str] = DEFAULT_FALLBACKS) -> str | None:
    """The final answer by the first strategy in `fallbacks` that finds one (or None); a
    Unicode minus sign reads as "-" (`ascii_minus`)."""
    text = ascii_minus(text)
    for name in fallbacks:
        strategy = STRATEGIES.get(name)
        if strategy is None:
            raise ValueError(f"unknown answer fallback {name!r}; choose from {FALLBACKS}")
        answer = strategy(text)
        if answer:
            return answer
    return None


def gold_answer(ground_truth: str) -> str:
    """A dataset's answer field as a bare answer: the content of the last \\boxed{} of a
    worked solution, else the part after GSM8K's "####"; any other text unchanged. \\boxed
    comes first because a worked solution's markdown may use "####" headings."""
    ground_truth = ascii_minus(ground_truth)
    if "\\boxed" in ground_truth or "\\fbox" in ground_truth:
        boxed = last_boxed(ground_truth)
        if boxed:
            return boxed
    return last_gsm8k(ground_truth) or ground_truth

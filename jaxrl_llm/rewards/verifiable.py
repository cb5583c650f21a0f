"""Verifiable rewards on decoded text: math answers, exact match, format.

All share the signature `reward(response, ground_truth, **options) -> float` so that
`rewards/registry.py` can pick and combine them by name.

Time limits: `math_verify` bounds its own parsing and comparison with signal.alarm, which
works only in the main thread, and cannot interrupt long C-level work (a huge integer power
such as 9^{9^{9^{9}}} ran past 30 s here, holding the GIL so that no other thread could even
notice). `math_reward` uses those signal limits when called in the main thread and none
elsewhere; to bound every sample from any thread, score through `rewards.RewardPool`, which
runs rewards in worker processes and kills one that overruns.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import string
import threading
from collections.abc import Sequence

from math_verify import parse, verify
from math_verify.errors import TimeoutException

from jaxrl_llm.rewards.extraction import DEFAULT_FALLBACKS, extract_answer, gold_answer, last_tag
from jaxrl_llm.tools.python_tool import any_code_failed

logger = logging.getLogger(__name__)

TORL_CODE_FAILURE_PENALTY = -0.5


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _as_latex(answer: str) -> str:
    """Wraps a bare answer so that math_verify's LaTeX extraction sees it as one expression."""
    if "\\boxed" in answer or answer.lstrip().startswith("$"):
        return answer
    return "\\boxed{" + answer + "}"


def answers_equivalent(predicted: str, gold: str, *, timeout_s: float = 5.0) -> bool:
    """Whether two answers are mathematically equal, by math_verify's parse + verify.

    Covers fractions vs decimals, \\dfrac, units in \\text{}, intervals, sets, \\text{}
    wrappers and percentages (see tests/rewards), and a number followed by words ("18 eggs",
    `_readings`). `timeout_s` applies only in the main thread.
    """
    if _normalise_latex(predicted) == _normalise_latex(gold):
        return True
    seconds = max(1, math.ceil(timeout_s)) if _in_main_thread() else None
    try:
        gold_parsed = list(_parsed(_as_latex(gold), seconds))  # verify takes a list
        if not gold_parsed:
            return False
        for latex in _readings(predicted):
            pred_parsed = list(_parsed(latex, seconds))
            if pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=seconds):
                return True
        return False
    except (Exception, TimeoutException) as e:  # malformed LaTeX; out of time (a BaseException)
        logger.debug("math_verify failed on %r vs %r: %s", predicted, gold, e)
        return False


# A word of two or more letters that is not a LaTeX command ("eggs", not "\\frac").
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _readings(predicted: str) -> list[str]:
    """The LaTeX to parse `predicted` as: `_as_latex`'s, then, for a phrase of words around
    one number ("18 eggs", which \\boxed{} reads as 18*e*g*g*s), the phrase unwrapped, where
    math_verify finds the number. Never for several numbers ("3 apples, not 5")."""
    wrapped = _as_latex(predicted)
    loose = (
        wrapped != predicted and _WORD.search(predicted) and len(_NUMBER.findall(predicted)) == 1
    )
    return [wrapped, predicted] if loose else [wrapped]


@functools.lru_cache(maxsize=4096)
def _parsed(latex: str, seconds: int | None) -> tuple:
    """math_verify's parse of `latex`, kept for its next comparison: maj@k compares each
    answer with every class before it, and a parse costs most of a comparison. A parse out
    of time raises `TimeoutException` and is not kept (a stall of a busy host must not mark
    that string unparsable for good; math_verify returns [] for it unless asked to raise);
    a malformed string is kept as no parse, () (the same every time). Kept as a tuple, so no
    caller can change it: callers pass verify a list of it (verify reads a tuple as one
    expression)."""
    try:
        # None disables parse's alarm (off the main thread), though its stub says int.
        return tuple(parse(latex, parsing_timeout=seconds, raise_on_error=True))  # pyright: ignore[reportArgumentType]
    except Exception:  # malformed: parse's own [] without raise_on_error
        return ()


def _normalise_latex(text: str) -> str:
    return re.sub(r"\s+", "", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def math_reward(
    response: str,
    ground_truth: str | Sequence[str],
    *,
    correct: float = 1.0,
    incorrect: float = -1.0,
    fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
    code_failure_penalty: float = 0.0,
    timeout_s: float = 5.0,
) -> float:
    """`correct` if the response's final answer equals `ground_truth`, else `incorrect`.

    The answer is found by `fallbacks` (default: the last \\boxed{}, then GSM8K's "####",
    then "the answer is"; see `rewards/extraction.py`); no answer scores `incorrect`. The
    ground truth may be a bare answer or a worked solution ending in "#### 72" or
    \\boxed{72} (`extraction.gold_answer`), or a list (or tuple) of such accepted answers,
    as the data pipeline keeps them: the answer is correct when it equals any of them (an
    empty list accepts none). Defaults are ToRL's +1/-1.
    `code_failure_penalty` is added when any ```output block in the response shows a failed
    run (ToRL: -0.5; off by default); detection is `tools.python_tool.any_code_failed`.
    """
    answer = extract_answer(response, fallbacks)
    golds = list(ground_truth) if isinstance(ground_truth, list | tuple) else [ground_truth]
    ok = answer is not None and any(
        answers_equivalent(answer, gold_answer(str(gold)), timeout_s=timeout_s) for gold in golds
    )
    reward = correct if ok else incorrect
    if code_failure_penalty and any_code_failed(response):
        reward += code_failure_penalty
    return float(reward)


def normalize_answer(text: str) -> str:
    """Search-R1 / SQuAD normalisation: lowercase, drop punctuation and the articles
    a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match_reward(
    response: str,
    ground_truth: str | Sequence[str],
    *,
    correct: float = 1.0,
    incorrect: float = 0.0,
    tag: str = "answer",
) -> float:
    """Search-R1's EM: the last <answer>...</answer>, normalised, equals any gold answer.

    Deviation: Search-R1 scores None when the *whole* sequence (prompt included) has at most
    one <answer> tag, because its prompt shows one; here only the response is scored, so its
    last tag is the answer.
    """
    answer = last_tag(response, tag)
    if answer is None:
        return float(incorrect)
    golds = [ground_truth] if isinstance(ground_truth, str) else list(ground_truth)
    predicted = normalize_answer(answer)
    return float(correct if any(predicted == normalize_answer(g) for g in golds) else incorrect)


def _block(tag: str, *, allow_open: bool = False) -> str:
    """<tag>...</tag> whose content cannot run past its closing tag (nor open another
    <tag> unless `allow_open`), so that a fullmatch cannot span blocks."""
    stop = rf"</{tag}>" if allow_open else rf"</?{tag}>"
    return rf"<{tag}>(?:(?!{stop}).)*</{tag}>"


_FORMATS = {
    # A final \boxed{...} answer exists (the math prompt's request).
    "boxed": None,
    # DeepSeek-R1 style: <think>...</think> then <answer>...</answer>, nothing else.
    "think_answer": re.compile(
        rf"\s*{_block('think', allow_open=True)}\s*{_block('answer')}\s*", re.DOTALL
    ),
    # Search-R1 style: <think>/<search>/<information> turns ending in one <answer>.
    "search_r1": re.compile(
        rf"\s*(?:{_block('think', allow_open=True)}\s*|{_block('search', allow_open=True)}\s*|"
        rf"{_block('information', allow_open=True)}\s*)*{_block('answer')}\s*",
        re.DOTALL,
    ),
}

FORMAT_STYLES = tuple(_FORMATS)


def format_reward(
    response: str,
    ground_truth: object = None,
    *,
    style: str = "boxed",
    correct: float = 1.0,
    incorrect: float = 0.0,
) -> float:
    """`correct` when the response follows the format `style` (see `_FORMATS`), else
    `incorrect`; `ground_truth` is ignored."""
    if style not in _FORMATS:
        raise ValueError(f"unknown format style {style!r}; choose from {sorted(_FORMATS)}")
    pattern = _FORMATS[style]
    if pattern is None:
        ok = extract_answer(response, ("boxed",)) is not None
    else:
        ok = pattern.fullmatch(response) is not None
    return float(correct if ok else incorrect)


def code_failure_reward(response: str, ground_truth: object = None, *, penalty: float = -0.5):
    """`penalty` when any code run shown in the response failed, else 0 (for combining)."""
    return float(penalty if any_code_failed(response) else 0.0)

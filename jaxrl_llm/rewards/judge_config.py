"""LLM judges: `JudgeConfig`, the "judge:/path" reward names, the judge's prompt and the
verdict parsers, kept apart from the judge itself (`rollout.judge`, which samples through
the rollout sampler seam) so that reading a config never imports JAX.

A judge reads the question, the reference answer and the response in `JudgeConfig.template`
and writes a verdict; `parse_verdict` turns the verdict's text into a score, or None (the
judge is asked again, then scored `unparsed_score`) when the text does not say one thing.
Markdown emphasis ("**8**/10", "_correct_") and code marks are ignored; "1,000" is 1000.
- "number": a rating N, written alone, as "N/M" or "N out of M" (M must be `scale`, else the
  judge rated on another scale: None). Scale statements are not ratings: "1-10", "1 to 10",
  "between 1 and 10", "scale of 10", "10-point", a lone "(out of 10)". Of the ratings left:
  1. the last *marked* one: MT-Bench's "[[N]]", or N after a verdict word (verdict,
     judgement, decision, grade, score, rating) and ":", "=", "is" or "of" ("Score: 7/10",
     "My rating is 6", "Rating (1-10): 7");
  2. else the last written over `scale` ("7/10", "7 out of 10"; "3/4" is not a rating);
  3. else the bare numbers, which must all be equal ("12 vs 15. 2" is None: which one?).
- "boxed": the last `\\boxed{...}` (`\\text{}` unwrapped): a rating as above, or exactly one
  of `labels` (case-insensitive).
- "label": `labels`' keys as whole words, case-insensitive, the longest where they overlap
  ("partly correct" over "correct"; "correct" is not inside "incorrect"). A mention in a
  question ("Is it correct?") or after "if"/"whether" in its clause is no verdict and is
  skipped. The 4 words before a label qualify it: a hedge ("partially", "mostly",
  "probably", ..., "not entirely/quite/sure ...") makes it None; a negation ("not",
  "never", "cannot", "...n't") makes it the lower of two label scores when it names the
  higher ("not correct" -> incorrect's score), else None. A negation farther back in the
  clause ("cannot confirm that it is correct") leaves only the lowest label readable. A
  negation never reads as a higher score. The verdict is:
  1. the first label of the last sentence after a verdict word ("Verdict: incorrect. The
     correct answer is 5" -> incorrect);
  2. else every mention, which must agree ("Incorrect. The correct answer is 5" is None).
A number is divided by `scale` (a 1-10 rating with scale 10 scores in [0.1, 1]); a Unicode
minus sign (U+2212, or an en dash opening a number) reads as "-" ("\u22121" is -1). A score
outside `score_range` ([0, 1] by default, the defaults' 0/1 verdict; labels must lie in it)
does not parse: \\boxed{1000} or \\boxed{-50} is a judge off its format, asked again and
then scored `unparsed_score`, never a reward beyond the judge's declared range. A parser is
one function in `PARSERS`, so a new verdict format is one function.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gin

from jaxrl_llm.config_checks import ConfigError, Ge, Gt, checked_fields, documented
from jaxrl_llm.data.examples import last_user_message
from jaxrl_llm.rewards.extraction import ascii_minus, last_boxed

JUDGE_PREFIX = "judge:"

DEFAULT_TEMPLATE = (
    "You are grading a student's answer to a question.\n\n"
    "Question:\n{question}\n\n"
    "Reference answer:\n{reference}\n\n"
    "Student's response:\n{response}\n\n"
    "Is the student's final answer equivalent to the reference answer? Think briefly, then "
    "give your verdict as \\boxed{{1}} (correct) or \\boxed{{0}} (incorrect)."
)
TEMPLATE_FIELDS = ("question", "reference", "response")

_NUMBER = r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?!\w)"
# A rating: a number, over a denominator when written as one ("7/10", "7 out of 10").
_FRACTION = rf"(?P<n>{_NUMBER})(?:\s*(?:/|\bout\s+of\b)\s*(?P<m>{_NUMBER}))?"
# Scale statements (module docstring); ranges go first, so "scale of 1 to 10" leaves no 1.
_SCALES = (
    re.compile(
        rf"{_NUMBER}\s*(?:[-–—]|\bto\b)\s*{_NUMBER}|\bbetween\s+{_NUMBER}\s+and\s+{_NUMBER}",
        re.IGNORECASE,
    ),
    re.compile(
        rf"\bscale\s+of\s+{_NUMBER}|{_NUMBER}\s*-?\s*point\b"
        rf"|(?<![\d.\s])\s*(?:/|\bout\s+of\b)\s*{_NUMBER}",  # no numerator: "(out of 10)"
        re.IGNORECASE,
    ),
)
# A verdict word and what joins it to the verdict: "Score: ", "rating is ", "Grade (): ".
_MARKER = (
    r"\b(?:verdict|judge?ment|decision|grade|score|rating)\b"
    r"[^\w\n]*?(?:\b(?:is|of)\b[^\w\n]*?)?"
)
_RATING = re.compile(rf"(?P<marked>\[\[\s*(?={_NUMBER}\s*\]\])|{_MARKER})?{_FRACTION}", re.I)
# A verdict word and the rest of its sentence (a decimal point does not end it).
_MARKED = re.compile(rf"{_MARKER}(?P<verdict>(?:[^.!?\n]|\.(?=\d))*)", re.IGNORECASE)
_EMPHASIS = re.compile(r"(?<!\w)(\*{1,3}|_{1,3})(?=\S)(.+?)(?<=\S)\1(?!\w)")
_CLAUSE_ENDS = ".,;:!?()\n"
_NEGATIONS = frozenset({"not", "never", "cannot"})  # and any word ending in "n't"
# After a negation these make a hedge, not a negation: "not entirely correct", "not sure".
_NOT_FULLY = frozenset(
    {"entirely", "fully", "completely", "totally", "quite", "all", "wholly", "exactly"}
    | {"sure", "certain"}
)
_HEDGES = frozenset(
    {"partially", "partly", "mostly", "largely", "almost", "nearly", "somewhat", "half"}
    | {"probably", "possibly", "maybe", "perhaps", "likely"}
)
_CONDITIONS = frozenset({"if", "whether"})
_WINDOW = 4  # words before a label that qualify it


def _plain(text: str) -> str:
    """`text` without markdown emphasis ("**8**/10") or code marks and without thousands
    separators, a Unicode minus sign as "-" ("−1"); a lone "*" (2*3) stays."""
    text = _EMPHASIS.sub(r"\2", ascii_minus(text).replace("`", ""))
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)


def _rating(n: str, m: str | None, config: JudgeConfig) -> float | None:
    """A rating N (over M) divided by `config.scale`; None when M is not the scale."""
    if m is not None and float(m) != config.scale:
        return None
    return float(n) / config.scale


def parse_number(text: str, config: JudgeConfig) -> float | None:
    """The judge's rating divided by `config.scale`: the last marked one, else the last over
    the scale, else the one bare number (module docstring); None when there is none, when
    bare numbers disagree, or when the chosen rating is over another denominator."""
    text = _plain(text)
    for scales in _SCALES:
        text = scales.sub(" ", text)
    found = [(bool(r["marked"]), r["n"], r["m"]) for r in _RATING.finditer(text)]
    marked = [(n, m) for is_marked, n, m in found if is_marked]
    if marked:
        return _rating(*marked[-1], config)
    over_scale = [n for _, n, m in found if m is not None and float(m) == config.scale]
    if over_scale:
        return float(over_scale[-1]) / config.scale
    bare = {float(n) for _, n, m in found if m is None}
    return bare.pop() / config.scale if len(bare) == 1 else None


def _label_mentions(text: str, labels: Mapping[str, float]) -> list[tuple[int, int, float]]:
    """(start, end, score) of each label in `text` (whole words, case-insensitive), in
    order; a mention inside a longer one ("correct" in "partly correct") is dropped."""
    found = [
        (m.start(), m.end(), float(score))
        for label, score in labels.items()
        for m in re.finditer(rf"(?<![\w-]){re.escape(label)}(?![\w-])", text, re.IGNORECASE)
    ]
    return sorted(
        f for f in found if not any(o != f and o[0] <= f[0] and f[1] <= o[1] for o in found)
    )


def _clause_before(text: str, start: int) -> list[str]:
    """The lower-cased words of `start`'s clause before it."""
    begin = max(text.rfind(c, 0, start) for c in _CLAUSE_ENDS) + 1
    return text[begin:start].lower().split()


def _is_verdict(text: str, start: int, end: int) -> bool:
    """Whether a label mention asserts: not in a question, nor after "if"/"whether"."""
    in_question = re.match(r"[^.!?\n]*\?", text[end:]) is not None
    return not in_question and not _CONDITIONS & set(_clause_before(text, start))


def _is_negation(word: str) -> bool:
    return word in _NEGATIONS or word.endswith(("n't", "n\u2019t"))


def _mention_score(clause: list[str], score: float, scores: list[float]) -> float | None:
    """A label's score as the words of its `clause` before it qualify it (module docstring):
    None when hedged; negated nearby, the lower of two label scores if it names the higher,
    else None; negated farther back in the clause, its score only if it is the lowest."""
    near = clause[-_WINDOW:]
    negated = [i for i, w in enumerate(near) if _is_negation(w)]
    if _HEDGES & set(near) or any(
        near[i + 1 : i + 2] and near[i + 1] in _NOT_FULLY for i in negated
    ):
        return None
    low, high = min(scores), max(scores)
    if negated:
        return low if len(set(scores)) == 2 and score == high else None
    if any(_is_negation(w) for w in clause):  # "cannot confirm that it is correct"
        return score if score == low else None
    return score


def parse_label(text: str, config: JudgeConfig) -> float | None:
    """The label verdict (module docstring): the first label after the last verdict word
    that is followed by one, else the label every mention agrees on; None when none does."""
    text, scores = _plain(text), [float(v) for v in config.labels.values()]
    readings = [
        (start, _mention_score(_clause_before(text, start), score, scores))
        for start, end, score in _label_mentions(text, config.labels)
        if _is_verdict(text, start, end)
    ]
    for marked in reversed(list(_MARKED.finditer(text))):
        inside = [r for start, r in readings if marked.start("verdict") <= start < marked.end()]
        if inside:
            return inside[0]
    said = {r for _, r in readings}
    return said.pop() if len(said) == 1 else None


def parse_boxed(text: str, config: JudgeConfig) -> float | None:
    """The last `\\boxed{...}` (a `\\text{}` in it unwrapped): its rating, as in
    `parse_number` (N or N/scale, divided by `scale`), or its label's score when it is
    exactly one of `labels`; None when there is no box or it holds neither."""
    content = last_boxed(text)
    if content is None:
        return None
    content = _plain(content).strip()
    wrapped = re.fullmatch(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{(.*)\}", content, re.S)
    content = wrapped.group(1).strip() if wrapped else content
    rating = re.fullmatch(_FRACTION, content, re.IGNORECASE)
    if rating:
        return _rating(rating["n"], rating["m"], config)
    scores = {k.lower(): float(v) for k, v in config.labels.items()}
    return scores.get(content.lower())


PARSERS: dict[str, Callable[[str, Any], float | None]] = {
    "number": parse_number,
    "boxed": parse_boxed,
    "label": parse_label,
}


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    parser=tuple(PARSERS),
    backend=("jax", "vllm"),
    dtype=("auto", "float32", "bfloat16"),
    max_new_tokens=Ge(1),
    max_prompt_length=Ge(2),
    retries=Ge(0),
    retry_temperature=Gt(0),
    scale=Gt(0),
    max_slots=Ge(1),
)
class JudgeConfig:
    """How a `judge:` LLM judge grades (docs/rewards.md, "LLM judges"); a judge's own options
    in `RewardConfig.weights` override these for that judge."""

    parser: str = documented(
        "boxed",
        "How a verdict becomes a score: 'boxed', 'number' or 'label' (rewards.judge_config).",
    )
    labels: dict[str, float] = documented(
        doc="Verdict labels and their scores, for 'label' (and a non-numeric 'boxed').",
        factory=lambda: {"correct": 1.0, "incorrect": 0.0},
    )
    scale: float = documented(
        1.0,
        "A numeric verdict is divided by this (10: a 1-10 rating); one written N/M or "
        "'N out of M' parses only when M is this.",
    )
    score_range: tuple[float, float] = documented(
        (0.0, 1.0),
        "Lowest and highest score a verdict may give (after `scale`); one outside does not "
        "parse (re-asked, then `unparsed_score`). `labels` must lie within it.",
    )
    template: str = documented(
        DEFAULT_TEMPLATE,
        "The judge's user message: a str.format template of {question} (the row's prompt), "
        "{reference} (the row's `reference_field`) and {response}; rendered by the judge "
        "checkpoint's chat template.",
    )
    reference_field: str = documented(
        "answer", "The data row's field that holds the reference answer ('' when none)."
    )
    max_new_tokens: int = documented(128, "Most tokens of one verdict.")
    max_prompt_length: int = documented(
        2048,
        "Most tokens of a judge prompt (at most the judge's context less `max_new_tokens`); "
        "a longer one is not judged: it scores `unparsed_score`, counted in "
        "`reward/<judge>/too_long`.",
    )
    retries: int = documented(
        2,
        "Re-asks of a judge whose verdict did not parse, sampled at `retry_temperature` with "
        "fixed seeds (the first ask is greedy); counted in `reward/<judge>/retries`.",
    )
    retry_temperature: float = documented(0.7, "Sampling temperature of a re-ask.")
    unparsed_score: float = documented(
        0.0, "Score of a response whose verdict never parsed (`reward/<judge>/unparsed`)."
    )
    backend: str = documented(
        "jax", "The judge's sampler: 'jax' (our engine) or 'vllm' (docs/vllm.md)."
    )
    dtype: str = documented("auto", "The judge's weights: 'auto' (float32 on CPU, else bfloat16).")
    max_slots: int = documented(32, "Verdicts decoded at once.")
    seed: int = documented(0, "Seed of re-asks (the first ask is greedy).")

    def __post_init__(self):
        check_template(self.template)
        if self.parser == "label" and not self.labels:
            raise ConfigError("JudgeConfig.parser = 'label' needs JudgeConfig.labels")
        low, high = self.score_range
        if not low < high:
            raise ConfigError(
                f"JudgeConfig.score_range = {self.score_range!r}: expected (low, high) with "
                "low < high, e.g. (0.0, 1.0)"
            )
        outside = {k: v for k, v in self.labels.items() if not low <= v <= high}
        if outside:
            raise ConfigError(
                f"JudgeConfig.labels {outside!r} score outside JudgeConfig.score_range = "
                f"{self.score_range!r}: widen the range or change the labels' scores"
            )


def check_template(template: str) -> None:
    """A clear error for a template that names another field or does not format."""
    try:
        template.format(**dict.fromkeys(TEMPLATE_FIELDS, ""))
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"JudgeConfig.template does not format ({type(e).__name__}: {e}): it may name "
            f"{{{'}, {'.join(TEMPLATE_FIELDS)}}} only; write a literal brace as {{{{ or }}}}"
        ) from None


def is_judge_reward(name: str) -> bool:
    """Whether a reward name is an LLM judge ("judge:/path" or "judge:builtin")."""
    return name.startswith(JUDGE_PREFIX)


def judge_folder(name: str) -> str:
    """The checkpoint of a "judge:<folder>" reward name (a folder, or 'builtin')."""
    folder = name[len(JUDGE_PREFIX) :]
    if not folder.strip():
        raise ConfigError(
            f"reward {name!r}: give the judge's checkpoint folder after 'judge:', e.g. "
            "'judge:/models/Qwen2.5-7B-Instruct'"
        )
    return folder


def question_text(example: Mapping[str, Any]) -> str:
    """The question a judge reads: the row's `prompt` (a string), or the last user message
    of its `prompt` or `messages` (chat messages)."""
    prompt = example.get("prompt")
    if isinstance(prompt, str):
        return prompt
    question = last_user_message(prompt if isinstance(prompt, list) else example.get("messages"))
    if question is None:
        raise ValueError(
            "a judge reads the row's 'prompt' (a string or chat messages with a user turn) or "
            f"'messages'; the row has {sorted(example)}"
        )
    return question


def judge_message(
    config: JudgeConfig,
    example: Mapping[str, Any],
    response: str,
    clean: Callable[[str], str] = str,
) -> str:
    """The judge's user message for one response to `example`; `clean` is applied to each
    inserted text (the judge neutralises its tokenizer's special-token strings there)."""
    reference = example.get(config.reference_field, "") if config.reference_field else ""
    if isinstance(reference, list | tuple):  # several accepted answers (data/examples.py)
        reference = " or ".join(str(r) for r in reference)
    return config.template.format(
        question=clean(question_text(example)),
        reference=clean(str(reference)),
        response=clean(response),
    )


def parse_verdict(text: str, config: JudgeConfig) -> float | None:
    """The verdict's score by `config.parser`; None when it does not parse or lies outside
    `config.score_range`."""
    score = PARSERS[config.parser](text, config)
    low, high = config.score_range
    return score if score is not None and low <= score <= high else None


def short_name(name: str) -> str:
    """A judge's name in metric keys: "judge:<folder basename>"."""
    return f"{JUDGE_PREFIX}{Path(judge_folder(name)).name}"

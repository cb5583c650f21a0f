"""LLM judges: `JudgeConfig`, the "judge:/path" reward names, the judge's prompt and the
verdict parsers, kept apart from the judge itself (`rollout.judge`, which samples through
the rollout sampler seam) so that reading a config never imports JAX.

A judge reads the question, the reference answer and the response in `JudgeConfig.template`
and writes a verdict; `parse_verdict` turns the verdict's text into a score:
- "number": the last number in the text; a rating written as a fraction reads as its
  numerator (`Score: 7/10` -> 7, which `scale` = 10 makes 0.7);
- "boxed": the last `\\boxed{...}`'s content, a number or one of `labels`;
- "label": the last of `labels`' keys in the text (whole words, case-insensitive), scored
  by its value; e.g. {"correct": 1.0, "incorrect": 0.0} ("correct" inside "incorrect" does
  not count; of labels ending at one place, the longest: "partly correct" over "correct").
A number is divided by `scale` (a 1-10 rating with scale 10 scores in [0.1, 1]). A score
outside `score_range` ([0, 1] by default, the defaults' 0/1 verdict; labels must lie in it)
does not parse: \boxed{1000} or \boxed{-50} is a judge off its format, asked again and
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
from jaxrl_llm.rewards.extraction import last_boxed

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

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# A number, and the denominator of a rating written as a fraction ("7/10"), if any.
_RATING = re.compile(rf"({_NUMBER})(?:\s*/\s*{_NUMBER})?")


def parse_number(text: str, config: JudgeConfig) -> float | None:
    """The last number in `text` (a fraction's numerator) divided by `config.scale`; None
    when there is none."""
    found = _RATING.findall(text.replace(",", ""))
    return float(found[-1]) / config.scale if found else None


def parse_label(text: str, config: JudgeConfig) -> float | None:
    """The score of the label of `config.labels` that stands last in `text` (whole words,
    case-insensitive; of two ending at the same place, the longer: "partly correct" over
    "correct"); None when none does."""
    best: tuple[int, int, float] | None = None
    for label, score in config.labels.items():
        for match in re.finditer(rf"(?<![\w-]){re.escape(label)}(?![\w-])", text, re.IGNORECASE):
            key = (match.end(), len(label), float(score))
            best = key if best is None or key[:2] > best[:2] else best
    return best[2] if best else None


def parse_boxed(text: str, config: JudgeConfig) -> float | None:
    """The last `\\boxed{...}`: its number (divided by `scale`) when it is one number, else
    its label's score; None when there is no box or it holds neither."""
    content = last_boxed(text)
    if content is None:
        return None
    number = content.replace(",", "")
    if re.fullmatch(_NUMBER, number):
        return float(number) / config.scale
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
    scale: float = documented(1.0, "A numeric verdict is divided by this (10: a 1-10 rating).")
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

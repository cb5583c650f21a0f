"""How answers and verdicts are read from text: the Unicode minus sign, format styles that
allow exactly one <answer>, and "the answer is" phrases with trailing words or inline math."""

import pytest

from jaxrl_llm.rewards import extract_answer, format_reward, math_reward
from jaxrl_llm.rewards.judge_config import JudgeConfig, parse_verdict

MINUS = "\u2212"
EN_DASH = "\u2013"


@pytest.mark.parametrize(
    ("text", "config", "expected"),
    [
        (f"Verdict: {MINUS}1", JudgeConfig(parser="number", score_range=(-1.0, 1.0)), -1.0),
        (f"Verdict: {EN_DASH}1", JudgeConfig(parser="number", score_range=(-1.0, 1.0)), -1.0),
        (f"Score: {MINUS}0.5", JudgeConfig(parser="number", score_range=(-1.0, 1.0)), -0.5),
    ],
)
def test_judge_reads_a_unicode_minus(text, config, expected):
    assert parse_verdict(text, config) == expected


def test_judge_scale_range_with_an_en_dash_is_still_a_range():
    config = JudgeConfig(parser="number", scale=10.0)
    assert parse_verdict(f"On a scale of 1{EN_DASH}10, Score: 7", config) == 0.7


@pytest.mark.parametrize(
    ("text", "fallbacks", "expected"),
    [
        (f"so x = {MINUS}5", ("last_number",), "-5"),
        (f"so x = {EN_DASH}5", ("last_number",), "-5"),
        (f"#### {MINUS}5", ("gsm8k",), "-5"),
        (f"The answer is {MINUS}5.", ("answer_is",), "-5"),
        (f"pages 3{EN_DASH}5", ("last_number",), "5"),  # a range, not a minus
    ],
)
def test_extraction_reads_a_unicode_minus(text, fallbacks, expected):
    assert extract_answer(text, fallbacks) == expected


def test_unicode_minus_answer_is_not_the_positive_one():
    fallbacks = ("boxed", "last_number")
    assert math_reward(f"so x = {MINUS}5", "5", fallbacks=fallbacks, incorrect=0.0) == 0.0
    assert math_reward(f"so x = {MINUS}5", "-5", fallbacks=fallbacks, incorrect=0.0) == 1.0
    assert math_reward(f"#### {MINUS}5", "-5", incorrect=0.0) == 1.0


@pytest.mark.parametrize("style", ["think_answer", "search_r1"])
@pytest.mark.parametrize(
    "response",
    [
        "<think>a</think><answer>1</answer> extra <answer>2</answer>",
        "<think>a</think><answer>1</answer><think>b</think><answer>2</answer>",
        "<think>a</think><answer>1</answer><answer>2</answer>",
        "<answer>1</answer><answer>2</answer>",
    ],
)
def test_format_allows_one_answer_at_the_end(style, response):
    assert format_reward(response, style=style) == 0.0


@pytest.mark.parametrize(
    ("style", "response"),
    [
        ("think_answer", "<think>a</think><answer>1</answer>"),
        (
            "think_answer",
            " <think>\nI could write <answer>x</answer> here\n</think>\n<answer>1</answer>\n",
        ),
        ("search_r1", "<answer>1</answer>"),
        (
            "search_r1",
            "<think>a</think><search>q</search><information>d</information><answer>1</answer>",
        ),
        (
            "search_r1",
            "<information>doc with <answer>x</answer> in it</information><answer>1</answer>",
        ),
    ],
)
def test_format_keeps_well_formed_responses(style, response):
    assert format_reward(response, style=style) == 1.0


@pytest.mark.parametrize(
    ("response", "gold", "extracted"),
    [
        ("The answer is $5$ dollars.", "5", "5"),
        ("So the final answer is $18$ eggs.", "18", "18"),
        ("The answer is $\\frac{1}{2}$ of the cake.", "\\frac{1}{2}", "\\frac{1}{2}"),
        ("The answer is \\(x+1\\) here.", "x+1", "x+1"),
        ("**Answer**: 1/2", "1/2", "1/2"),
        ("**Final Answer**: $\\frac{1}{2}$", "1/2", "\\frac{1}{2}"),
        ("The **answer** is 7.", "7", "7"),
        ("The answer is $5$.", "5", "5"),
    ],
)
def test_answer_phrase_takes_its_math(response, gold, extracted):
    assert extract_answer(response) == extracted
    assert math_reward(response, gold, incorrect=0.0) == 1.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [("The answer is 18 eggs.", "18"), ("She has 5 dollars left.\n#### 5 dollars", "5")],
)
def test_answer_with_trailing_words_is_read_unwrapped(response, gold):
    assert math_reward(response, gold, incorrect=0.0) == 1.0
    assert math_reward(response, str(int(gold) + 1), incorrect=0.0) == 0.0


@pytest.mark.parametrize(
    "response",
    ["The answer is 3 apples, not 5.", "The answer is 5 or 6 eggs.", "The answer is eggs."],
)
def test_phrase_with_several_numbers_or_none_is_not_read_loosely(response):
    assert math_reward(response, "5", incorrect=0.0) == 0.0

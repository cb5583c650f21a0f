"""LLM judges' config side (`rewards.judge_config`): the verdict parsers, the prompt, and
the checks a typo meets before any model loads."""

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.rewards.config import RewardConfig, check_rewards
from jaxrl_llm.rewards.judge_config import PARSERS, JudgeConfig, judge_message, parse_verdict
from jaxrl_llm.rewards.model_config import metric_names

LABELS = {"correct": 1.0, "incorrect": 0.0, "partly correct": 0.5}


@pytest.mark.parametrize(
    ("parser", "text", "score"),
    [
        ("number", "Reasoning... Score: 8", 8.0),
        ("number", "Rating: 7/10", None),  # over 10, not over `scale` (1): another scale
        ("number", "between 1 and 10, I give 1,000", 1000.0),
        ("number", "no digits at all", None),
        ("boxed", r"so \boxed{1} and that is all", 1.0),
        ("boxed", r"first \boxed{0}, on reflection \boxed{1}", 1.0),  # the last box
        ("boxed", r"\boxed{Incorrect}", 0.0),  # a label in the box
        ("boxed", r"\boxed{maybe}", None),
        ("boxed", "1", None),  # no box
        ("label", "The answer is incorrect.", 0.0),  # "correct" inside "incorrect": not it
        ("label", "incorrect at first, but CORRECT in the end", None),  # they disagree
        ("label", "Incorrect at first. Verdict: CORRECT.", 1.0),  # a verdict line decides
        ("label", "It is partly correct.", 0.5),
        ("label", "no verdict", None),
    ],
)
def test_verdict_parsers(parser, text, score):
    assert PARSERS[parser](text, JudgeConfig(parser=parser, labels=LABELS)) == score


def test_scale_divides_a_numeric_verdict():
    assert parse_verdict("Score: 7/10", JudgeConfig(parser="number", scale=10)) == 0.7
    assert parse_verdict(r"\boxed{4}", JudgeConfig(scale=8)) == 0.5


def test_the_prompt_holds_the_question_reference_and_response():
    cfg = JudgeConfig(template="Q={question} R={reference} A={response} {{literal}}")
    chat = {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q?"},
            {"role": "assistant", "content": "a draft"},
        ]
    }  # the last *user* turn
    assert judge_message(cfg, {**chat, "answer": 3}, "a") == "Q=q? R=3 A=a {literal}"
    no_ref = JudgeConfig(template="{question}|{reference}", reference_field="")
    assert judge_message(no_ref, {"prompt": "q", "answer": "x"}, "a") == "q|"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"template": "{question} {answer}"}, "may name"),
        ({"template": "{question"}, "does not format"),
        ({"parser": "regex"}, "parser"),
        ({"retries": -1}, "retries"),
        ({"parser": "label", "labels": {}}, "labels"),
    ],
)
def test_bad_judge_settings_are_refused(kwargs, match):
    with pytest.raises((ConfigError, ValueError), match=match):
        JudgeConfig(**kwargs)


def test_a_judge_name_is_checked_before_anything_loads(tmp_path):
    with pytest.raises(ConfigError, match="after 'judge:'"):
        RewardConfig(name="judge:")
    with pytest.raises(ConfigError, match="unknown option"):
        RewardConfig(weights={"judge:builtin": (1.0, {"temperature": 0.5})})
    with pytest.raises(ConfigError, match="no such folder"):
        check_rewards(RewardConfig(name=f"judge:{tmp_path}/missing"))
    check_rewards(RewardConfig(weights={"judge:builtin": 1.0, "math": 1.0}))


def test_metric_names_shorten_judges_like_reward_models():
    names = ["judge:/models/grader/", "judge:/other/grader", "judge:builtin", "math"]
    assert metric_names(names) == {
        "judge:/models/grader/": "judge:/models/grader/",
        "judge:/other/grader": "judge:/other/grader",
        "judge:builtin": "judge:builtin",
        "math": "math",
    }
    assert metric_names(["judge:/m/grader"]) == {"judge:/m/grader": "judge:grader"}


def test_a_list_of_accepted_answers_reaches_the_judge_as_text():
    template = "Q: {question}\nRef: {reference}\nA: {response}"
    config = JudgeConfig(template=template)
    row = {"prompt": "2*6?", "answer": ["12", "12.0"]}  # as the data pipeline keeps a list
    assert judge_message(config, row, "12") == "Q: 2*6?\nRef: 12 or 12.0\nA: 12"
    row = {"prompt": "2*6?", "answer": 12}
    assert judge_message(config, row, "12") == "Q: 2*6?\nRef: 12\nA: 12"


@pytest.mark.parametrize(
    ("text", "config", "score"),
    [
        (r"\boxed{1}", {}, 1.0),
        (r"\boxed{1.5}", {}, None),  # the default verdict is 0 or 1
        (r"\boxed{-0.5}", {}, None),
        ("Score: 11/10", {"parser": "number", "scale": 10.0}, None),
        ("Score: -3", {"parser": "number", "score_range": (-5.0, 5.0)}, -3.0),
    ],
)
def test_a_verdict_outside_the_score_range_does_not_parse(text, config, score):
    assert parse_verdict(text, JudgeConfig(**config)) == score


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"score_range": (1.0, 0.0)}, "score_range"),
        ({"labels": {"correct": 2.0, "incorrect": 0.0}}, "outside"),
    ],
)
def test_score_range_is_checked(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        JudgeConfig(**kwargs)

"""Math, exact-match and format rewards; answer extraction."""

import pytest

from jaxrl_llm.rewards import (
    exact_match_reward,
    extract_answer,
    format_reward,
    gold_answer,
    last_boxed,
    math_reward,
    normalize_answer,
)

EQUIVALENT = [  # (model's boxed answer, ground truth)
    ("0.5", r"\frac{1}{2}"),
    (r"\dfrac{3}{4}", "0.75"),
    (r"\tfrac12", "1/2"),
    (r"5\text{ cm}", "5"),
    ("5 cm", "5"),
    ("5", r"5 \text{ cm}"),
    ("[1,3)", "[1, 3)"),
    (r"(0, \infty)", r"(0,\infty)"),
    (r"\{3,2,1\}", r"\{1,2,3\}"),
    ("1,2,3", r"\{1,2,3\}"),
    ("B", r"\text{B}"),
    (r"\text{(B)}", "B"),
    (r"\frac{\sqrt2}{2}", r"\sqrt{2}/2"),
    ("50", r"50\%"),
    (r"x \in [2,5]", "[2, 5]"),
    ("-7", "-7.0"),
]
MISMATCHED = [("3", "4"), ("0.33", r"\frac{1}{3}"), ("100", "10"), ("(1,3)", "[1,3]")]
MISMATCHED += [(r"\{1,2\}", r"\{1,2,3\}"), (r"\sqrt{3}", r"\sqrt{2}"), ("A", "B")]


@pytest.mark.parametrize(("answer", "truth"), EQUIVALENT)
def test_equivalent_answers_score_plus_one(answer, truth):
    assert math_reward(f"Work... so the answer is $\\boxed{{{answer}}}$.", truth) == 1.0


@pytest.mark.parametrize(("answer", "truth"), MISMATCHED)
def test_mismatches_score_minus_one(answer, truth):
    assert math_reward(f"\\boxed{{{answer}}}", truth) == -1.0


def test_last_boxed_with_nested_braces():
    text = r"first \boxed{1} then \boxed{\frac{a^{2}}{\sqrt{b}}} and \{x\}"
    assert last_boxed(text) == r"\frac{a^{2}}{\sqrt{b}}"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert last_boxed(r"so \boxed 7 is it") == "7"
    assert last_boxed(r"\fbox{9}") == "9"
    assert last_boxed(r"\boxed{unclosed") is None


def test_fallbacks_are_configurable():
    text = "Therefore, the final answer is 12. Done"
    assert extract_answer(text, ("boxed",)) is None
    assert extract_answer(text, ("boxed", "answer_is")) == "12"
    assert extract_answer("we get 3 apples and then 1,024") is None  # no marker: no answer
    assert extract_answer("we get 3 apples and then 1,024", ("last_number",)) == "1024"
    assert extract_answer("<answer>Paris</answer>", ("answer_tag",)) == "Paris"
    with pytest.raises(ValueError, match="unknown answer fallback"):
        extract_answer("x", ("guess",))
    assert math_reward(text, "12", fallbacks=("boxed",)) == -1.0
    assert math_reward(text, "12", fallbacks=("boxed", "answer_is")) == 1.0


def test_default_extraction_reads_boxed_gsm8k_and_the_answer_is():
    assert extract_answer(r"so \boxed{7}. The answer is 8") == "7"  # boxed first
    assert extract_answer("She pays 3 * 4 = 12.\n#### 1,200") == "1200"
    assert extract_answer("#### 5\nthen more\n#### 6.") == "6"
    assert extract_answer("The answer is 42.") == "42"
    assert extract_answer("Final answer: $\\frac{1}{2}$\n") == "\\frac{1}{2}"
    # A GSM8K row's answer field is a worked solution ending in "#### 72".
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"
    assert gold_answer(solution) == "72"
    assert gold_answer(r"so the total is $\boxed{\frac{3}{4}}$.") == r"\frac{3}{4}"
    assert gold_answer("0.5") == "0.5"
    assert math_reward("... so she sold 72 in all.\n#### 72", solution) == 1.0
    assert math_reward("The answer is 72.", solution, correct=1.0, incorrect=0.0) == 1.0
    assert math_reward("The answer is 71.", solution, correct=1.0, incorrect=0.0) == 0.0


def test_reward_values_and_missing_answer():
    assert math_reward("no answer", "1") == -1.0
    assert math_reward(r"\boxed{1}", "1", correct=1.0, incorrect=0.0) == 1.0
    assert math_reward(r"\boxed{2}", "1", correct=1.0, incorrect=0.0) == 0.0
    assert math_reward(r"\boxed{\frac{1}{}", "1") == -1.0  # malformed LaTeX is just wrong


def test_code_failure_penalty_is_off_by_default():
    response = (
        "```python\n1/0\n```\n```output\nZeroDivisionError: division by zero\n```\n\\boxed{2}"
    )
    assert math_reward(response, "2") == 1.0
    assert math_reward(response, "2", code_failure_penalty=-0.5) == 0.5
    assert math_reward(response, "3", code_failure_penalty=-0.5) == -1.5
    clean = "```python\nprint(2)\n```\n```output\n2\n```\n\\boxed{2}"
    assert math_reward(clean, "2", code_failure_penalty=-0.5) == 1.0


def test_normalize_answer_like_search_r1():
    assert normalize_answer("  The Eiffel-Tower!  ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"


def test_exact_match_reward():
    response = "<think>hmm</think><search>q</search><answer> The Beatles </answer>"
    assert exact_match_reward(response, "beatles") == 1.0
    assert exact_match_reward(response, ["Rolling Stones", "the beatles."]) == 1.0
    assert exact_match_reward(response, "Beatles band") == 0.0
    assert exact_match_reward("no tag", "x") == 0.0
    assert exact_match_reward("<answer>a</answer> <answer>b</answer>", "b") == 1.0


def test_format_reward_styles():
    assert format_reward(r"so \boxed{3}") == 1.0 and format_reward("3") == 0.0
    ok = "<think>plan</think>\n<answer>4</answer>"
    assert format_reward(ok, style="think_answer") == 1.0
    assert format_reward(ok + " extra", style="think_answer") == 0.0
    search = "<think>a</think><search>q</search><information>d</information><answer>x</answer>"
    assert format_reward(search, style="search_r1") == 1.0
    assert format_reward("<answer>x</answer><answer>y</answer>!", style="search_r1") == 0.0
    with pytest.raises(ValueError, match="unknown format style"):
        format_reward("x", style="xml")


def test_a_markdown_heading_is_not_the_gsm8k_marker():
    # "#### Step 2" is a heading: a worked solution's gold answer is its \boxed{}.
    solution = "#### Step 1: Set up\nLet x be it.\n#### Step 2: Solve\n2x = 144, so $\\boxed{72}$."
    assert gold_answer(solution) == "72"
    assert math_reward(r"\boxed{72}", solution, correct=1.0, incorrect=0.0) == 1.0
    # In a response, a heading is skipped and "the answer is" / "Answer:" is read instead.
    for response in (
        "#### Step 1: add\n3 + 4 = 7\n#### Step 2: conclude\nThe answer is 7.",
        "Let me solve it.\n\n#### Final Answer\nThe answer is 7.",
        "#### Solution\n3+4 = 7.\n\nAnswer: 7",
    ):
        assert extract_answer(response) == "7", response
    # GSM8K's own answer lines still read: signs, thousands separators, currency.
    assert extract_answer("so 1,234 in all.\n#### 1,234") == "1234"
    assert extract_answer("she lost 5.\n#### -5") == "-5"
    assert gold_answer("it costs $12.\n#### $12") == "$12"
    assert math_reward(r"\boxed{12}", "it costs $12.\n#### $12", correct=1.0, incorrect=0.0) == 1.0
    assert gold_answer("#### .5") == ".5"
    assert extract_answer("#### Step 1\n#### 8") == "8"


def test_the_answer_is_in_markdown_bold():
    assert extract_answer("The answer is **7**.") == "7"
    assert extract_answer("**The final answer is $-3$**") == "-3"
    assert math_reward("The answer is **7**.", "7", correct=1.0, incorrect=0.0) == 1.0


def test_last_boxed_latex_line_break_and_brace_less_punctuation():
    assert last_boxed(r"\boxed{5\\}") == "5"  # a LaTeX line break, not an escaped brace
    assert last_boxed(r"\boxed{a \\ }") == "a"
    assert math_reward(r"\boxed{5\\}", "5", correct=1.0, incorrect=0.0) == 1.0
    assert last_boxed(r"\boxed{\begin{pmatrix} 1 \\ 2 \\\end{pmatrix}}") == (
        r"\begin{pmatrix} 1 \\ 2 \\\end{pmatrix}"
    )
    assert last_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"  # escaped braces still skipped
    assert last_boxed(r"so \boxed 5.") == "5"
    assert last_boxed(r"so \boxed 5, done") == "5"
    assert last_boxed(r"\boxed 3.5.") == "3.5"
    assert math_reward(r"\boxed 5.", "5", correct=1.0, incorrect=0.0) == 1.0


def test_math_reward_with_a_list_of_accepted_answers():
    # The data pipeline keeps a list of accepted answers as a list (data/examples.py).
    right = [(r"\boxed{2}", ["2", "3"]), (r"\boxed{3}", ["2", "3"]), (r"\boxed{0.5}", ["1/2"])]
    right += [(r"\boxed{3}", ("3", "three")), (r"\boxed{4}", ["3", r"... so \boxed{4}"])]
    for response, golds in right:
        assert math_reward(response, golds, correct=1.0, incorrect=0.0) == 1.0, golds
    wrong = [(r"\boxed{1}", ["12"]), (r"\boxed{1, 2}", ["1", "2"]), (r"\boxed{4}", [])]
    wrong += [(r"\boxed{2}", ("#### 3", r"so \boxed{4}"))]
    for response, golds in wrong:
        assert math_reward(response, golds, correct=1.0, incorrect=0.0) == 0.0, golds


def test_each_answer_is_parsed_once_across_comparisons(monkeypatch):
    """maj@k compares each answer with every class before it: math_verify parses each string
    once (`verifiable._parsed`), not twice per comparison, and the comparisons still see the
    parsed values (0.25 equals 1/4; 0.75 does not)."""
    from jaxrl_llm.rewards import verifiable

    seen: list[str] = []

    def counted(text: str, **kw):
        seen.append(text)
        return real(text, **kw)

    real = verifiable.parse
    monkeypatch.setattr(verifiable, "parse", counted)
    verifiable._parsed.cache_clear()
    texts = ["0.25", "\\frac{1}{4}", "0.75"]
    got = [verifiable.answers_equivalent(a, b) for a in texts for b in texts if a != b]
    assert got == [True, False, True, False, False, False]
    assert sorted(seen) == sorted("\\boxed{" + t + "}" for t in texts)


def test_a_parse_out_of_time_is_not_kept(monkeypatch):
    """One stalled parse (a busy host) scores that sample wrong, as before, but is not kept:
    math_verify returns [] for a parse out of time, and keeping it marked the truth
    unparsable for the rest of the process (every later sample of that prompt scored 0)."""
    import time

    import math_verify.parser as mvp

    from jaxrl_llm.rewards import verifiable

    real, stall = mvp.extract_target_from_pred, {"on": True}

    def sometimes_slow(*args, **kwargs):
        if stall["on"]:
            time.sleep(3)
        return real(*args, **kwargs)

    monkeypatch.setattr(mvp, "extract_target_from_pred", sometimes_slow)
    verifiable._parsed.cache_clear()
    score = lambda: verifiable.math_reward(r"\boxed{72}", "72.0", incorrect=0.0, timeout_s=1)
    assert score() == 0.0  # out of time (1 s)
    stall["on"] = False
    assert score() == 1.0

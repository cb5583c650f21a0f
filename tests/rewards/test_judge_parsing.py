"""LLM judges' verdict grammar (`rewards.judge_config`, docs/rewards.md "LLM judges"): the
forms real judges write read as what the judge meant, and a reply that could mean two
things does not parse (None: re-asked, then `unparsed_score`) rather than being guessed.

Each expected number is the judge's rating in its own units; the test divides it by the
config's `scale` the way the parser does, so the comparison is exact."""

import pytest

from jaxrl_llm.rewards.judge_config import JudgeConfig, parse_verdict

TEN = {"parser": "number", "scale": 10.0}  # a 1-10 rating read into [0, 1]


@pytest.mark.parametrize(
    ("text", "rating"),
    [
        # A rating over the configured scale reads its numerator.
        ("Score: 7/10", 7),
        ("7 out of 10", 7),
        ("Rating: 3 out of 10.", 3),
        ("**8**/10", 8),  # markdown emphasis
        ("Rating: **8/10**", 8),
        ("Score: 8.5/10", 8.5),
        ("Rating: 6 / 10", 6),
        ("I'd give it a 7 out of 10, though steps 2 and 3 are thin.", 7),
        ("7/10 -- the student got 3/4 of the steps right", 7),  # 3/4: not over the scale
        ("6/10 at first glance; on reflection, 8/10.", 8),  # the last rating over the scale
        # MT-Bench's [[rating]].
        ("[[6]]", 6),
        ("The response is accurate and clear. Rating: [[6]]", 6),
        # A marked verdict (Score / Rating / Grade / Verdict ...): the last one.
        ("Score: 8", 8),
        ("My rating is 6.", 6),
        ("Score: 9. The student wrote 42 and the reference is 42.", 9),
        ("Accuracy score: 8\nClarity score: 6\nOverall score: 7", 7),
        ("Score (1-10): 7", 7),
        ("Rating (out of 10): 7", 7),
        ("Final verdict = 5", 5),
        # Scale statements are not ratings.
        ("I'd give it a 4. (scale 1-10)", 4),
        ("On a scale of 1 to 10, I'd rate it 6.", 6),
        ("I'd rate it 6 on a scale of 1 to 10.", 6),
        ("I'd give this 7 on a scale of 10.", 7),
        ("Between 1 and 10: 9", 9),
        ("On a 10-point scale, 7", 7),
        ("8", 8),
        # Does not parse: another scale, a range, disagreeing bare numbers, nothing.
        ("Score: 4/5", None),  # rated on another scale than `scale`
        ("4/5", None),
        ("Score: 7-8", None),  # a range is not a rating
        ("The student wrote 12 and the reference is 15. 2", None),  # which is the rating?
        ("Score: 11/10", None),  # outside score_range
        ("no rating here", None),
    ],
)
def test_numeric_verdicts(text, rating):
    want = None if rating is None else rating / TEN["scale"]
    assert parse_verdict(text, JudgeConfig(**TEN)) == want


@pytest.mark.parametrize(
    ("text", "config", "score"),
    [
        ("between 1 and 10, I give 1,000", {"score_range": (0.0, 1e4)}, 1000.0),
        ("Score: -3", {"score_range": (-5.0, 5.0)}, -3.0),
        ("Score: 1/1", {}, 1.0),
        ("7/10", {"score_range": (0.0, 10.0)}, None),  # scale 1: 10 is not its denominator
    ],
)
def test_numeric_verdicts_at_other_scales(text, config, score):
    assert parse_verdict(text, JudgeConfig(parser="number", **config)) == score


BINARY = {"correct": 1.0, "incorrect": 0.0}
GRADED = {"correct": 1.0, "partially correct": 0.5, "incorrect": 0.0}


@pytest.mark.parametrize(
    ("text", "labels", "score"),
    [
        ("Correct.", BINARY, 1.0),
        ("_Correct_", BINARY, 1.0),
        ("The answer is correct", BINARY, 1.0),
        ("incorrect", BINARY, 0.0),
        ("INCORRECT", BINARY, 0.0),
        ("The reasoning is correct and the final answer is correct.", BINARY, 1.0),
        # A negated label: never the positive one. Of two scores, it reads as the lower.
        ("Not correct", BINARY, 0.0),
        ("This is not correct", BINARY, 0.0),
        ("The answer isn't correct.", BINARY, 0.0),
        ("The answer is **not** correct.", BINARY, 0.0),  # markdown emphasis
        ("This is not the correct answer.", BINARY, 0.0),
        ("not incorrect", BINARY, None),  # never read as the positive label
        ("Not correct", GRADED, None),  # three scores: which one is "not correct"?
        # A hedged label does not parse, unless the whole phrase is a label.
        ("partially correct", BINARY, None),
        ("The answer is partially correct.", GRADED, 0.5),
        ("not entirely correct", BINARY, None),
        ("not quite correct", BINARY, None),
        ("mostly incorrect", BINARY, None),
        ("It is probably correct.", BINARY, None),
        ("I am not sure it is correct.", BINARY, None),
        # A negation farther back in the clause leaves only the lowest label readable.
        ("I cannot confirm that the answer is correct.", BINARY, None),
        ("It does not match the reference so it is incorrect.", BINARY, 0.0),
        # A label in a question or after "whether" / "if" is not a verdict.
        ("Is the answer correct? No, it is incorrect.", BINARY, 0.0),
        ("Is the answer correct? Yes.", BINARY, None),
        ("I checked whether the answer is correct. It matches: correct.", BINARY, 1.0),
        # Without a verdict line, labels that disagree do not parse ...
        ("Incorrect. The correct answer is 12.", BINARY, None),
        ("incorrect at first, but CORRECT in the end", BINARY, None),
        # ... with one, its first label decides.
        ("Verdict: incorrect. The correct answer is 12.", BINARY, 0.0),
        ("**Verdict:** Incorrect\nThe reasoning is correct but 3 + 4 is not 8.", BINARY, 0.0),
        ("Final judgement: not correct, the correct answer is 5.", BINARY, 0.0),
        ("The working is fine.\nVerdict: correct", BINARY, 1.0),
        ("No, the student's answer does not match.", {"yes": 1.0, "no": 0.0}, 0.0),
        ("no verdict", BINARY, None),
    ],
)
def test_label_verdicts(text, labels, score):
    assert parse_verdict(text, JudgeConfig(parser="label", labels=labels)) == score


@pytest.mark.parametrize(
    ("text", "scale", "score"),
    [
        (r"\boxed{1}", 1.0, 1.0),
        (r"\boxed{7/10}", 10.0, 7 / 10.0),
        (r"\boxed{7 out of 10}", 10.0, 7 / 10.0),
        (r"\boxed{4/5}", 10.0, None),  # another scale
        (r"\boxed{\text{Incorrect}}", 1.0, 0.0),
        (r"\boxed{Not correct}", 1.0, None),  # not a label
    ],
)
def test_boxed_verdicts(text, scale, score):
    assert parse_verdict(text, JudgeConfig(scale=scale)) == score

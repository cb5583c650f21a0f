"""Step-by-step text arithmetic (the fair ToRL no-tool arm's SFT data)."""

import pytest

from jaxrl_llm.data.tasks import arithmetic, stepwise


def test_level3_product_by_place_value():
    problem = {
        "id": "p",
        "level": 3,
        "prompt": "Ann buys 47 boxes of 385 pens. How many pens is that?",
        "answer": "18095",
    }
    assert stepwise.stepwise_solution(problem) == (
        "47 * 300 = 14100.\n47 * 80 = 3760.\n47 * 5 = 235.\n"
        "14100 + 3760 + 235 = 18095.\nThe answer is \\boxed{18095}."
    )


def test_level4_skips_zero_digits_then_subtracts():
    problem = {
        "id": "p",
        "level": 4,
        "prompt": "Tom buys 608 boxes of 23 cards and gives away 372. How many cards are left?",
        "answer": str(608 * 23 - 372),
    }
    assert stepwise.stepwise_solution(problem) == (
        "23 * 600 = 13800.\n23 * 8 = 184.\n13800 + 184 = 13984.\n"
        "13984 - 372 = 13612.\nThe answer is \\boxed{13612}."
    )


def test_every_generated_problem_in_vocabulary_and_within_budget():
    for p in arithmetic.generate_problems(500, seed=1):
        text = stepwise.stepwise_solution(p)
        assert set(text) <= set(arithmetic.VOCABULARY)
        assert text.endswith(f"\\boxed{{{p['answer']}}}.")
        assert len(text) < 160  # torl_tiny_fair.gin's RolloutConfig.max_new_tokens


def test_sft_rows_share_prompts():
    problems = arithmetic.generate_problems(20, seed=2)
    tool, text = stepwise.sft_rows(problems, "tool"), stepwise.sft_rows(problems, "stepwise")
    assert [r["prompt"] for r in tool] == [r["prompt"] for r in text]
    assert all("```python" in r["response"] for r in tool)
    assert not any("```" in r["response"] for r in text)


def test_bad_problems_are_named():
    with pytest.raises(ValueError, match="problem 'q': steps give 6, its answer is 7"):
        stepwise.stepwise_solution({"id": "q", "level": 3, "prompt": "2 boxes of 3", "answer": "7"})
    with pytest.raises(ValueError, match="level 4 with numbers \\[2, 3\\]"):
        stepwise.stepwise_solution({"id": "q", "level": 4, "prompt": "2 and 3", "answer": "1"})
    with pytest.raises(ValueError, match="style must be 'tool' or 'stepwise', got 'x'"):
        stepwise.sft_rows([], "x")

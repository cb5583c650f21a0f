"""`jaxrl-llm eval`: the unbiased pass@k estimator, majority voting, and an end-to-end run."""

from __future__ import annotations

import json
import math

import pytest

from jaxrl_llm import cli
from jaxrl_llm.metrics.evaluate import majority_answer, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 0.7
        (5, 0, 3, 0.0),
        (5, 3, 3, 1.0),  # n - c = 2 < k: every 3-subset holds a correct sample
        (5, 5, 1, 1.0),
        (10, 3, 4, 1 - math.comb(7, 4) / math.comb(10, 4)),  # 1 - 35/210
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_matches_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct():
    for c in range(9):
        assert pass_at_k(8, c, 1) == pytest.approx(c / 8, abs=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="k=3 > n=2"):
        pass_at_k(2, 1, 3)


def test_majority_answer_counts_ties_and_missing():
    assert majority_answer(["3", "4", "4", "3", "4"]) == "4"
    assert majority_answer(["7", "5", "5", "7"]) == "7"  # tie: the first seen wins
    assert majority_answer(["5", "7", "7", "5"]) == "5"
    assert majority_answer([None, None, "2"]) == "2"  # unparsed answers do not vote
    assert majority_answer([None, "1", "2", None]) == "1"
    assert majority_answer([None, None]) is None
    assert majority_answer([]) is None


def test_eval_command_end_to_end_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "eval.json"
    argv = ["eval", "--checkpoint", "builtin", "--data", "builtin", "--limit", "4",
            "--max-new-tokens", "16", "--n", "2", "--temperature", "1.0", "--k", "1", "2",
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["problems"] == 4 and summary["n"] == 2
    for key in ("pass@1", "pass@2", "maj@1", "maj@2"):
        assert 0.0 <= summary[key] <= 1.0, key
    assert summary["pass@1"] <= summary["pass@2"]
    assert len(result["samples"]) == 4
    for row in result["samples"]:
        assert set(row) == {"id", "answer", "correct", "answers", "texts"}
        assert len(row["texts"]) == len(row["correct"]) == len(row["answers"]) == 2
    printed = capsys.readouterr().out
    assert "pass@2" in printed and "maj@2" in printed

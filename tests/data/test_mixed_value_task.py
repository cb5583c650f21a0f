"""The LIMR miniature's mixed-value prompt set: kinds, labels, determinism, bad input."""

import re

import pytest

from jaxrl_llm.data.tasks import arithmetic, mixed_value

COUNTS = {"easy": 5, "hard": 7, "noisy": 4}


def _true_answer(row):
    nums = [int(x) for x in re.findall(r"\d+", row["prompt"])]
    return nums[0] * nums[1] - (nums[2] if len(nums) == 3 else 0)


def test_counts_levels_and_ids():
    rows = mixed_value.generate_mix(COUNTS, seed=3)
    assert mixed_value.count_kinds(rows) == COUNTS
    assert [r["id"] for r in rows] == [f"mix-{i:05d}" for i in range(16)]
    assert len({r["prompt"] for r in rows}) == 16
    for r in rows:
        assert r["level"] in ((1,) if r["item_kind"] == "easy" else (3, 4))
        assert arithmetic.split_of(r["prompt"]) == "train"  # never a validation prompt


def test_noisy_labels_are_wrong_and_clean_labels_right():
    for r in mixed_value.generate_mix(COUNTS, seed=3):
        if r["item_kind"] == "hard":
            assert int(r["answer"]) == _true_answer(r)
        elif r["item_kind"] == "noisy":
            assert int(r["answer"]) != _true_answer(r)
            assert 1 <= abs(int(r["answer"]) - _true_answer(r)) <= 90


def test_deterministic_in_seed_and_kinds_are_shuffled():
    a = mixed_value.generate_mix(COUNTS, seed=3)
    assert a == mixed_value.generate_mix(COUNTS, seed=3)
    assert a != mixed_value.generate_mix(COUNTS, seed=4)
    kinds = [r["item_kind"] for r in a]
    assert kinds != sorted(kinds, key=mixed_value.ITEM_KINDS.index)


def test_bad_kind_or_count_is_named():
    with pytest.raises(ValueError, match="item kind 'trivial' is not one of"):
        mixed_value.generate_mix({"trivial": 3})
    with pytest.raises(ValueError, match="count of 'noisy' items must be >= 0, got -1"):
        mixed_value.generate_mix({"noisy": -1})
    with pytest.raises(ValueError, match="has item_kind None"):
        mixed_value.count_kinds([{"id": "x"}])

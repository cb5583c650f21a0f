"""Reward plug-ins for jaxrl-llm: the worked example of docs/rewards.md.

Each reward is fn(response, example, **options) -> float, where `example` is the data row:
example["prompt"], example["answer"] and every other column of the training file.
"""

from jaxrl_llm.rewards import math_reward


def brevity(response, example, *, max_chars=400):
    """1.0 up to the row's "max_chars" column (else `max_chars`), then falling linearly to
    0.0 at twice that length."""
    limit = int(example.get("max_chars", max_chars))
    over = max(len(response) - limit, 0)
    return max(1.0 - over / limit, 0.0)


def math_with_unit(response, example, *, correct=1.0, incorrect=0.0):
    """`correct` when the final answer equals the row's answer and the response names the
    row's "unit" column (e.g. "cm"); a row without that column is an error."""
    unit = example["unit"]
    right = math_reward(response, example["answer"], correct=1.0, incorrect=0.0) == 1.0
    return correct if right and unit in response else incorrect

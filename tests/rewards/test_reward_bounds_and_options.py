"""Start-up and per-sample guards the advantages rely on: a score beyond float32 fails its
sample as NaN does (scores are recorded in float32, where it is inf); a NaN / inf weight and a
built-in's option value outside its choices are `ConfigError`s when the config is checked,
before any model loads."""

import math

import numpy as np
import pytest

from jaxrl_llm.config_checks import FLOAT32_MAX, ConfigError
from jaxrl_llm.rewards.config import RewardConfig, check_rewards
from jaxrl_llm.rewards.extraction import FALLBACKS
from jaxrl_llm.rewards.registry import build_reward, combine_rewards, score_error

HERE = "tests.rewards.test_reward_bounds_and_options"


def exp_length_penalty(response, example):
    """A shaped reward finite in float64 that overflows float32 for long responses."""
    return -math.exp(len(response) / 10)


def large(response, example):
    return 1e30


def test_float32_max_is_float32s_largest_number():
    assert float(np.finfo(np.float32).max) == FLOAT32_MAX


@pytest.mark.parametrize("value", [-1.2204032943178408e39, 1e39, 10**400, -(10**400)])
def test_score_beyond_float32_is_an_error(value):
    error = score_error("r", value)
    assert isinstance(error, ValueError) and "float32" in str(error)


@pytest.mark.parametrize("value", [FLOAT32_MAX, -FLOAT32_MAX, 0.0, np.float32(3e38)])
def test_scores_within_float32_pass(value):
    assert score_error("r", value) is None


def test_reward_beyond_float32_raises_as_for_nan():
    reward = build_reward(f"{HERE}:exp_length_penalty")
    assert reward("short", {}) == pytest.approx(-math.exp(0.5))
    with pytest.raises(ValueError, match="float32"):
        reward("y" * 900, {})


def test_weighted_total_beyond_float32_raises():
    combined = combine_rewards({f"{HERE}:large": 1e10})  # each part in float32, the sum not
    with pytest.raises(ValueError, match="float32"):
        combined("x", {})
    with pytest.raises(ValueError, match="float32"):
        combined.scored_parts("x", {})


@pytest.mark.parametrize(
    "weights",
    [
        {"math": float("nan")},
        {"math": float("inf"), "format": 0.1},
        {"math": 1.0, "format": (float("-inf"), {"style": "boxed"})},
        {"math": 1e39},
        {"rm:/some/folder": float("nan")},
        {"judge:/some/folder": (float("inf"), {})},
    ],
)
def test_non_finite_weight_is_a_config_error(weights):
    bad = next(k for k, v in weights.items() if not abs(v[0] if isinstance(v, tuple) else v) < 1e39)
    with pytest.raises(ConfigError, match=rf"RewardConfig.weights\[{bad!r}\]") as info:
        RewardConfig(weights=weights)
    assert "finite number" in str(info.value).splitlines()[0]  # one line (gin adds its own)


def test_combine_rewards_rejects_a_non_finite_weight():
    with pytest.raises(ValueError, match=r"'math'.*finite"):
        combine_rewards({"math": float("nan")})


@pytest.mark.parametrize(
    ("weights", "choices"),
    [
        ({"format": (1.0, {"style": "think-answer"})}, "think_answer"),
        ({"math": (1.0, {"fallbacks": ("boxed", "lastnumber")})}, "last_number"),
        ({"math": (1.0, {"fallbacks": "boxed"})}, "last_number"),  # a string, not a list
    ],
)
def test_option_value_outside_its_choices_fails_at_check(weights, choices):
    with pytest.raises(ConfigError, match=r"RewardConfig\.weights") as info:
        check_rewards(RewardConfig(weights=weights))
    assert choices in str(info.value) and "\n" not in str(info.value)


def test_option_values_within_their_choices_pass():
    check_rewards(
        RewardConfig(
            weights={
                "math": (1.0, {"fallbacks": FALLBACKS}),
                "format": (0.1, {"style": "search_r1"}),
            }
        )
    )
    check_rewards(RewardConfig(weights={"math": (1.0, {"fallbacks": ["boxed"]})}))

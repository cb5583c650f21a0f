"""Verifiable rewards on decoded text (math via math-verify, exact match, format, code),
chosen by registered name or import path and combined with weights (docs/rewards.md)."""

from jaxrl_llm.rewards.extraction import extract_answer, gold_answer, last_boxed, last_tag
from jaxrl_llm.rewards.pool import RewardErrors, RewardPool, ScoreFailure
from jaxrl_llm.rewards.registry import (
    CombinedReward,
    Reward,
    build_reward,
    combine_rewards,
    get_reward,
    register_reward,
    reward_names,
)
from jaxrl_llm.rewards.verifiable import (
    TORL_CODE_FAILURE_PENALTY,
    answers_equivalent,
    code_failure_reward,
    exact_match_reward,
    format_reward,
    math_reward,
    normalize_answer,
)

__all__ = [
    "TORL_CODE_FAILURE_PENALTY",
    "CombinedReward",
    "Reward",
    "RewardErrors",
    "RewardPool",
    "ScoreFailure",
    "answers_equivalent",
    "build_reward",
    "code_failure_reward",
    "combine_rewards",
    "exact_match_reward",
    "extract_answer",
    "format_reward",
    "get_reward",
    "gold_answer",
    "last_boxed",
    "last_tag",
    "math_reward",
    "normalize_answer",
    "register_reward",
    "reward_names",
]

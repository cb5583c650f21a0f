"""`RewardConfig`: which verifiable reward scores an RL run, and its worker pool (gin)."""

from __future__ import annotations

import dataclasses

import gin


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RewardConfig:
    name: str = "math"
    correct: float = 1.0
    incorrect: float = 0.0
    code_failure_penalty: float = 0.0
    timeout_s: float = 5.0
    workers: int = 2


def build_reward_pool(cfg: RewardConfig):
    """A `RewardPool` of `cfg.workers` processes scoring with reward `cfg.name`; each reward
    takes the options it declares (e.g. `math`: the code penalty and time limit)."""
    from jaxrl_llm.rewards.pool import RewardPool
    from jaxrl_llm.rewards.registry import get_reward_declared

    fn = get_reward_declared(
        cfg.name, correct=cfg.correct, incorrect=cfg.incorrect,
        code_failure_penalty=cfg.code_failure_penalty, timeout_s=cfg.timeout_s,
    )  # fmt: skip
    return RewardPool(
        fn, num_workers=cfg.workers, timeout_s=cfg.timeout_s, timeout_value=cfg.incorrect
    )

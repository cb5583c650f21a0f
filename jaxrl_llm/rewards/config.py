"""`RewardConfig`: which rewards score an RL run, their weights, and the worker pool (gin).

One reward:      RewardConfig.name = "math"                      (registered name)
                 RewardConfig.name = "mypkg.rewards:brevity"     (import path)
Several, summed: RewardConfig.weights = {"math": 1.0, "mypkg.rewards:brevity": 0.1}
                 (a value may be (weight, {option: value}) for that reward's own options)
Every reward is offered `correct`, `incorrect`, `code_failure_penalty` and `timeout_s` and
takes those it declares as parameters. See docs/rewards.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gin

from jaxrl_llm.config_checks import Ge, Gt, checked_fields, documented


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(timeout_s=Gt(0), workers=Ge(1))
class RewardConfig:
    """How samples are scored: which rewards, their weights and scores, the worker pool."""

    name: str = documented(
        "math",
        "The reward, a registered name or 'package.module:function'; used when `weights` is None.",
    )
    weights: dict[str, Any] | None = documented(
        None,
        "Several rewards, summed: {reward: weight}, or {reward: (weight, {option: value})} "
        "for that reward's own options; None: `name` alone.",
    )
    correct: float = documented(1.0, "Score of a correct answer (offered to every reward).")
    incorrect: float = documented(
        0.0, "Score of a wrong or missing answer, and of a sample whose reward timed out or raised."
    )
    code_failure_penalty: float = documented(
        0.0, "Added when a response's code run failed (ToRL uses -0.5); 0: off."
    )
    timeout_s: float = documented(
        5.0, "Seconds a sample's scoring may take before it scores `incorrect`."
    )
    workers: int = documented(2, "Worker processes that score samples in parallel.")
    max_error_frac: float = documented(
        0.5,
        "A fraction in [0, 1]: a batch where more samples than this made the reward raise "
        "stops the run.",
    )

    def __post_init__(self):
        if not 0.0 <= self.max_error_frac <= 1.0:
            raise ValueError(
                f"RewardConfig.max_error_frac = {self.max_error_frac!r}: expected a fraction "
                "in [0, 1]"
            )
        if self.weights is not None and not self.weights:
            raise ValueError("RewardConfig.weights = {}: give at least one reward, or None")
        if self.weights is not None and self.name != "math" and self.name not in self.weights:
            raise ValueError(
                f"RewardConfig.name = {self.name!r} is not among RewardConfig.weights "
                f"{sorted(self.weights)}: with weights set, name is unused; add it to weights "
                "or drop the name binding"
            )

    @property
    def offered(self) -> dict[str, Any]:
        """The settings every reward may declare and take."""
        return {
            "correct": self.correct,
            "incorrect": self.incorrect,
            "code_failure_penalty": self.code_failure_penalty,
            "timeout_s": self.timeout_s,
        }


def configured_reward(cfg: RewardConfig):
    """The configured reward as `fn(response, example) -> float` (picklable): `cfg.name`
    alone, or the weighted sum of `cfg.weights`."""
    from jaxrl_llm.rewards.registry import build_reward, combine_rewards, declared_options

    if cfg.weights is None:
        return build_reward(cfg.name, **declared_options(cfg.name, cfg.offered))
    return combine_rewards(dict(cfg.weights), offered=cfg.offered)


def build_reward_pool(cfg: RewardConfig):
    """A `RewardPool` of `cfg.workers` processes scoring with `configured_reward(cfg)`; every name
    and option is checked here, before any worker starts."""
    from jaxrl_llm.rewards.pool import RewardPool

    return RewardPool(
        configured_reward(cfg),
        num_workers=cfg.workers,
        timeout_s=cfg.timeout_s,
        timeout_value=cfg.incorrect,
        max_error_frac=cfg.max_error_frac,
    )

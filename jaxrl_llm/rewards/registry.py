"""Rewards by name, and their weighted combination: the one place configs pick rewards.

    reward = combine_rewards({"math": 1.0, "format": (0.1, {"style": "boxed"})})
    reward(response, ground_truth) -> float          # sum of weight * component
    reward.components(response, ground_truth)        # {"math": ..., "format": ...} for logs

Names and options are checked when the reward is built (unknown name or option: an error
listing what exists), so a typo fails at start-up, before anything compiles.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from jaxrl_llm.rewards import verifiable

RewardFn = Callable[..., float]

_REGISTRY: dict[str, RewardFn] = {
    "math": verifiable.math_reward,
    "exact_match": verifiable.exact_match_reward,
    "format": verifiable.format_reward,
    "code_failure": verifiable.code_failure_reward,
}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator adding `fn(response, ground_truth, **options) -> float` under `name`."""

    def add(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return add


def reward_names() -> list[str]:
    return sorted(_REGISTRY)


def get_reward(name: str, **options: Any) -> RewardFn:
    """The reward registered as `name`, with `options` bound and checked now."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown reward {name!r}; registered: {reward_names()}")
    fn = _REGISTRY[name]
    try:
        inspect.signature(fn).bind("response", "ground_truth", **options)
    except TypeError as e:
        raise TypeError(f"bad options for reward {name!r}: {e}") from None
    return functools.partial(fn, **options) if options else fn


def get_reward_declared(name: str, **options: Any) -> RewardFn:
    """`get_reward` with only the `options` the reward declares as keyword parameters: a
    trainer hands over every setting it has and each reward takes its own."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown reward {name!r}; registered: {reward_names()}")
    declared = set(list(inspect.signature(_REGISTRY[name]).parameters)[2:])
    return get_reward(name, **{k: v for k, v in options.items() if k in declared})


@dataclasses.dataclass(frozen=True)
class CombinedReward:
    """sum_i weight_i * reward_i(response, ground_truth). Picklable (names, not functions),
    so it can be sent to `RewardPool` workers."""

    spec: tuple[tuple[str, float, tuple[tuple[str, Any], ...]], ...]

    def __post_init__(self):
        for name, _, options in self.spec:
            get_reward(name, **dict(options))

    def components(self, response: str, ground_truth: Any) -> dict[str, float]:
        return {
            name: get_reward(name, **dict(options))(response, ground_truth)
            for name, _, options in self.spec
        }

    def __call__(self, response: str, ground_truth: Any) -> float:
        parts = self.components(response, ground_truth)
        return float(sum(weight * parts[name] for name, weight, _ in self.spec))


def combine_rewards(
    weights: Mapping[str, float | tuple[float, Mapping[str, Any]]],
) -> CombinedReward:
    """Builds a `CombinedReward` from {name: weight} or {name: (weight, options)}."""
    if not weights:
        raise ValueError("combine_rewards needs at least one reward")
    spec = []
    for name, value in weights.items():
        weight, options = value if isinstance(value, tuple) else (value, {})
        spec.append((name, float(weight), tuple(sorted(dict(options).items()))))
    return CombinedReward(tuple(spec))

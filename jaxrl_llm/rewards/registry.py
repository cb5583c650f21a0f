"""Rewards by name or import path, and their weighted combination: how configs pick rewards.

A reward is `fn(response, example, **options) -> float`: `example` is the whole data row
(`example["prompt"]`, `example["answer"]` and every other column of the file). A config
names one by a registered name ("math") or by import path ("mypkg.rewards:brevity"), e.g.

    reward = build_reward("mypkg.rewards:brevity")
    reward(response, {"prompt": "...", "answer": "42", "source": "gsm8k"}) -> float
    reward = combine_rewards({"math": 1.0, "format": (0.1, {"style": "boxed"})})
    reward.components(response, example)   # {"math": ..., "format": ...} for logs

The built-ins (`math`, `exact_match`, `format`, `code_failure`) keep their public form
`fn(response, ground_truth, **options)` (e.g. `math_reward(response, "42")`); they are
registered with `gets="answer"`, so the row's "answer" is what they receive. Names, paths and
options are checked when a reward is built (an error says what exists), so a typo fails at
start-up, before anything compiles. A reward that returns NaN, inf or something that is not a
number raises (`finite_score`; its rule, `score_error`, holds reward models and judges too),
so that sample fails as if the reward had raised. `Reward` and `CombinedReward` hold the
functions themselves, pickled by module and name, so `RewardPool`'s spawned workers import
them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrl_llm.config_checks import FLOAT32_MAX
from jaxrl_llm.rewards import verifiable
from jaxrl_llm.rewards.extraction import FALLBACKS
from jaxrl_llm.tools.factory import resolve_import_path

RewardFn = Callable[..., float]
GETS = ("example", "answer")

_REGISTRY: dict[str, RewardFn] = {
    "math": verifiable.math_reward,
    "exact_match": verifiable.exact_match_reward,
    "format": verifiable.format_reward,
    "code_failure": verifiable.code_failure_reward,
}
# Registered rewards whose second argument is the row's "answer" rather than the row.
_GETS_ANSWER: set[str] = set(_REGISTRY)
# The values a built-in's option may take, checked when it is built (a typo must not wait for
# the first sample): {reward: {option: (choices, whether the value is a list of them)}}.
_CHOICES: dict[str, dict[str, tuple[tuple[str, ...], bool]]] = {
    "math": {"fallbacks": (FALLBACKS, True)},
    "format": {"style": (tuple(verifiable.FORMAT_STYLES), False)},
}


def register_reward(name: str, *, gets: str = "example") -> Callable[[RewardFn], RewardFn]:
    """Decorator adding `fn(response, example, **options) -> float` under `name`.

    `gets="answer"`: the function's second argument is `example["answer"]` (the ground
    truth) instead of the whole row. The function must be importable by its module and
    name (defined at module level) for `RewardPool`'s worker processes to find it.
    """
    if gets not in GETS:
        raise ValueError(f"register_reward(gets={gets!r}): choose from {GETS}")

    def add(fn: RewardFn) -> RewardFn:
        if ":" in name:
            raise ValueError(f"reward name {name!r} must not contain ':' (that marks a path)")
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered")
        _REGISTRY[name] = fn
        (_GETS_ANSWER.add if gets == "answer" else _GETS_ANSWER.discard)(name)
        return fn

    return add


def reward_names() -> list[str]:
    return sorted(_REGISTRY)


def resolve_reward(name: str) -> tuple[RewardFn, str]:
    """The function named by a registered name or a "package.module:function" path, and
    what its second argument is ("example" or "answer")."""
    if ":" not in name:
        if name not in _REGISTRY:
            raise KeyError(
                f"unknown reward {name!r}; registered: {reward_names()}, "
                "or give an import path 'package.module:function'"
            )
        return _REGISTRY[name], "answer" if name in _GETS_ANSWER else "example"
    return resolve_import_path(name, "reward"), "example"


def _check_options(name: str, fn: RewardFn, options: Mapping[str, Any]) -> None:
    try:
        inspect.signature(fn).bind("response", "example", **options)
    except TypeError as e:
        raise TypeError(
            f"reward {name!r} cannot be called as fn(response, example"
            f"{''.join(f', {k}=...' for k in options)}): {e}"
        ) from None


def _check_values(name: str, options: Mapping[str, Any]) -> None:
    """`ValueError` naming the choices when a built-in's option value is not one of them."""
    for option, (choices, many) in _CHOICES.get(name, {}).items():
        if option not in options:
            continue
        value = options[option]
        if many:
            ok = not isinstance(value, str | bytes) and isinstance(value, Sequence)
            ok = ok and all(v in choices for v in value)
            expected = f"a list of {choices}"
        else:
            ok, expected = value in choices, f"one of {choices}"
        if not ok:
            raise ValueError(f"reward {name!r} option {option} = {value!r}: expected {expected}")


def get_reward(name: str, **options: Any) -> RewardFn:
    """The function `name` refers to, with `options` bound and checked now; its second
    argument is what it was registered with (the ground truth for the built-ins)."""
    fn, _ = resolve_reward(name)
    _check_options(name, fn, options)
    _check_values(name, options)
    return functools.partial(fn, **options) if options else fn


def declared_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of `options` that reward `name` declares as parameters (all of them when it
    takes **kwargs): a trainer offers every setting it has and each reward takes its own."""
    params = list(inspect.signature(resolve_reward(name)[0]).parameters.values())[2:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(options)
    return {k: v for k, v in options.items() if k in {p.name for p in params}}


def get_reward_declared(name: str, **options: Any) -> RewardFn:
    """`get_reward` with only the `options` the reward declares (see `declared_options`)."""
    return get_reward(name, **declared_options(name, options))


def answer_of(example: Any, reward: str) -> Any:
    """The ground truth in a data row, with an error naming the reward when it has none."""
    if not isinstance(example, Mapping):
        raise TypeError(
            f"reward {reward!r} is called with the data row (a mapping with an 'answer' "
            f"field), got a {type(example).__name__}"
        )
    if "answer" not in example:
        raise KeyError(f"reward {reward!r} needs the row's 'answer'; it has {sorted(example)}")
    return example["answer"]


RULE_FIX = "return a finite float (the pool scores this sample as when the reward raises)"


def score_error(
    name: str, value: Any, *, where: str = "", fix: str = RULE_FIX
) -> TypeError | ValueError | None:
    """Why `value` is not a score of reward `name`, or None when it is one: NaN, inf or not a
    number would reach the advantages, so the sample fails as when the reward raises (scored
    `RewardConfig.incorrect`, counted in `reward/errors`); so does a number beyond float32
    (|score| > `FLOAT32_MAX`), the precision scores are recorded in, where it is inf. The one
    rule for rule rewards (`finite_score`), reward models and judges (`ModelAndRuleRewards`)
    and `jaxrl-llm score`; the error names the reward, the value, `where` (e.g. " on sample
    3") and `fix`."""
    if isinstance(value, str | bytes):
        return TypeError(f"reward {name!r} returned {value!r}{where}, not a number: {fix}")
    try:
        score = float(value)
    except OverflowError:  # an int beyond float64
        score = math.inf
    except (TypeError, ValueError):
        return TypeError(f"reward {name!r} returned {value!r}{where}, not a number: {fix}")
    if math.isnan(score):
        return ValueError(f"reward {name!r} returned {value!r}{where}, not a finite number: {fix}")
    if abs(score) > FLOAT32_MAX:
        shown = f"{score:.4g}" if math.isfinite(score) else repr(value)
        return ValueError(
            f"reward {name!r} returned {shown}{where}, not a finite float32 number "
            f"(|score| <= {FLOAT32_MAX:.4g}): {fix}"
        )
    return None


def finite_score(name: str, value: Any) -> float:
    """`value` as a float, or `score_error`'s error for it raised."""
    error = score_error(name, value)
    if error is not None:
        raise error
    return float(value)


@dataclasses.dataclass(frozen=True)
class Reward:
    """One configured reward, called as `reward(response, example) -> float`. Picklable when
    `fn` is a module-level function (pickle stores its module and name)."""

    name: str
    fn: RewardFn
    gets: str = "example"
    options: tuple[tuple[str, Any], ...] = ()

    def __call__(self, response: str, example: Mapping[str, Any]) -> float:
        arg = answer_of(example, self.name) if self.gets == "answer" else example
        return finite_score(self.name, self.fn(response, arg, **dict(self.options)))

    @property
    def part_names(self) -> tuple[str, ...]:
        """The names `scored_parts` reports under (`RewardPool.last_parts`)."""
        return (self.name,)

    def scored_parts(
        self, response: str, example: Mapping[str, Any]
    ) -> tuple[float, dict[str, tuple[float, float]]]:
        """The score, and {name: (score, seconds it took)}."""
        t0 = time.perf_counter()
        score = self(response, example)
        return score, {self.name: (score, time.perf_counter() - t0)}


def build_reward(name: str, **options: Any) -> Reward:
    """The reward `name` (registered name or import path) with `options` bound and checked."""
    fn, gets = resolve_reward(name)
    _check_options(name, fn, options)
    _check_values(name, options)
    return Reward(name, fn, gets, tuple(sorted(options.items())))


@dataclasses.dataclass(frozen=True)
class CombinedReward:
    """sum_i weight_i * reward_i(response, example); picklable like its `Reward`s."""

    parts: tuple[tuple[Reward, float], ...]

    def components(self, response: str, example: Mapping[str, Any]) -> dict[str, float]:
        return {reward.name: reward(response, example) for reward, _ in self.parts}

    def __call__(self, response: str, example: Mapping[str, Any]) -> float:
        total = sum(weight * reward(response, example) for reward, weight in self.parts)
        return finite_score(self.total_name, total)

    @property
    def total_name(self) -> str:
        """What the weighted total's errors name: "math + format"."""
        return " + ".join(self.part_names)

    @property
    def part_names(self) -> tuple[str, ...]:
        return tuple(reward.name for reward, _ in self.parts)

    def scored_parts(
        self, response: str, example: Mapping[str, Any]
    ) -> tuple[float, dict[str, tuple[float, float]]]:
        """The weighted sum (`__call__`'s, added in the same order) and each reward's
        unweighted score and seconds: {name: (score, seconds)}."""
        parts = {}
        for reward, _ in self.parts:
            t0 = time.perf_counter()
            score = reward(response, example)
            parts[reward.name] = (score, time.perf_counter() - t0)
        total = sum(weight * parts[reward.name][0] for reward, weight in self.parts)
        return finite_score(self.total_name, total), parts


NOT_A_NUMBER = "expected a number"


def weight_problem(weight: Any) -> str | None:
    """Why `weight` cannot weigh a reward, or None: not a number (a bool neither), or not
    finite in float32 (a NaN or inf weight would fail every sample with an error blaming
    the reward). The one rule of `combine_rewards` and `RewardConfig`'s check."""
    if not isinstance(weight, int | float) or isinstance(weight, bool):
        return NOT_A_NUMBER
    if not abs(weight) <= FLOAT32_MAX:
        return f"expected a finite number (|weight| <= {FLOAT32_MAX:.4g})"
    return None


def combine_rewards(
    weights: Mapping[str, float | tuple[float, Mapping[str, Any]]],
    *,
    offered: Mapping[str, Any] | None = None,
) -> CombinedReward:
    """A `CombinedReward` from {name: weight} or {name: (weight, options)}. `offered`: options
    (e.g. correct/incorrect) given to each reward that declares them; a reward's own options
    take precedence."""
    if not weights:
        raise ValueError("combine_rewards needs at least one reward")
    parts = []
    for name, value in weights.items():
        weight, options = value if isinstance(value, tuple) else (value, {})
        problem = weight_problem(weight)
        if problem is not None:
            error = TypeError if problem == NOT_A_NUMBER else ValueError
            raise error(f"reward weight for {name!r} is {weight!r}: {problem}")
        merged = {**declared_options(name, offered or {}), **dict(options)}
        parts.append((build_reward(name, **merged), float(weight)))
    return CombinedReward(tuple(parts))

"""`RewardConfig`: which rewards score an RL run, their weights, and the worker pool (gin).

One reward:      RewardConfig.name = "math"                      (registered name)
                 RewardConfig.name = "mypkg.rewards:brevity"     (import path)
Several, summed: RewardConfig.weights = {"math": 1.0, "mypkg.rewards:brevity": 0.1}
                 (a value may be (weight, {option: value}) for that reward's own options)
Every reward is offered `correct`, `incorrect`, `code_failure_penalty` and `timeout_s` and
takes those it declares as parameters.
A reward model:  RewardConfig.name = "rm:/path/to/folder"       (an HF *ForSequenceClassification
                 folder, scored on device in the trainer's process: `rewards.model`; its
                 settings in `RewardModelConfig`, or per model as the options of its weight)
An LLM judge:    RewardConfig.name = "judge:/path/to/folder"    (a causal LM checkpoint that
                 writes a verdict through the rollout sampler seam: `rollout.judge`; its
                 settings in `JudgeConfig`, or per judge as the options of its weight)
See docs/rewards.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import gin
import numpy as np

from jaxrl_llm.config_checks import (
    ConfigError,
    Ge,
    Gt,
    checked_fields,
    documented,
    with_options,
)
from jaxrl_llm.rewards.judge_config import JudgeConfig, is_judge_reward, judge_folder
from jaxrl_llm.rewards.model_config import (
    RewardModelConfig,
    is_model_reward,
    model_folder,
)

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from jaxrl_llm.rewards.combined import ModelAndRuleRewards
    from jaxrl_llm.rewards.pool import RewardPool

# What builds an LLM judge from its reward name, its config and the mesh (`rollout.judge`:
# it samples through the rollout sampler seam, a layer above this one, so the caller hands
# it in).
JudgeFactory = Callable[[str, JudgeConfig, Any], Any]


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(timeout_s=Gt(0), workers=Ge(1))
class RewardConfig:
    """How samples are scored: which rewards, their weights and scores, the worker pool."""

    name: str = documented(
        "math",
        "The reward, a registered name, 'package.module:function', 'rm:/reward/model/folder' "
        "or 'judge:/llm/folder' (an LLM judge); used when `weights` is None.",
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
    model: RewardModelConfig = documented(
        doc="How 'rm:' reward models score.", factory=RewardModelConfig
    )
    judge: JudgeConfig = documented(doc="How 'judge:' LLM judges grade.", factory=JudgeConfig)

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
        for name, value in self.rewards().items():
            _check_weight(name, value)
            if is_model_reward(name):
                model_folder(name)
                with_options(self.model, _options(value), f"reward {name!r}")
            elif is_judge_reward(name):
                judge_folder(name)
                with_options(self.judge, _options(value), f"reward {name!r}")

    def rewards(self) -> dict[str, Any]:
        """{reward name: weight or (weight, options)}: `weights`, or `name` alone at 1.0."""
        return dict(self.weights) if self.weights is not None else {self.name: 1.0}

    @property
    def offered(self) -> dict[str, Any]:
        """The settings every reward may declare and take."""
        return {
            "correct": self.correct,
            "incorrect": self.incorrect,
            "code_failure_penalty": self.code_failure_penalty,
            "timeout_s": self.timeout_s,
        }


def solved(scores: Any, correct: float) -> np.ndarray:
    """Which samples solved their problem: score >= `RewardConfig.correct`, compared in
    float32, the precision scores are recorded in (float32(0.9) is below the float 0.9). A
    bonus below `correct` (format) does not make a wrong answer solved; a penalty (ToRL's
    failed code cell) can leave a right one unsolved. The one rule of `val/test_score`
    (`RolloutStage.validate`), `jaxrl-llm eval` and LIMR's accuracies (`data.limr`)."""
    return np.asarray(scores, np.float32) >= np.float32(correct)


def _check_weight(name: str, value: Any) -> None:
    """`ConfigError` unless reward `name`'s weight can weigh it (`registry.weight_problem`)."""
    from jaxrl_llm.rewards.registry import weight_problem

    weight = value[0] if isinstance(value, tuple) else value
    problem = weight_problem(weight)
    if problem is not None:
        raise ConfigError(
            f"RewardConfig.weights[{name!r}] = {weight!r}: {problem}; set the weight, or drop "
            "the reward"
        )


def _options(value: Any) -> Mapping[str, Any]:
    return value[1] if isinstance(value, tuple) else {}


def _weight(value: Any) -> float:
    return float(value[0] if isinstance(value, tuple) else value)


def configured_reward(cfg: RewardConfig, *, field: str | None = None):
    """The configured rule rewards as `fn(response, example) -> float` (picklable): `cfg.name`
    alone, or the weighted sum of `cfg.weights`' rule rewards (its `rm:` models and `judge:`
    judges aside; None when there is no rule reward). A name that resolves to nothing, or
    options or a weight it cannot take, is a `ConfigError` naming `field` (default: the
    config field)."""
    from jaxrl_llm.rewards.registry import build_reward, combine_rewards, declared_options

    rules = {k: v for k, v in cfg.rewards().items() if not on_device(k)}
    if not rules:
        return None
    field = field or _field(cfg)
    try:
        if cfg.weights is None:
            return build_reward(cfg.name, **declared_options(cfg.name, cfg.offered))
        return combine_rewards(rules, offered=cfg.offered)
    except (KeyError, TypeError, ValueError, ImportError) as e:  # the registry's checks
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise ConfigError(f"{field}: {message}") from None


def _field(cfg: RewardConfig) -> str:
    """The config field that names `cfg`'s rewards, for its errors."""
    return "RewardConfig.name" if cfg.weights is None else "RewardConfig.weights"


def on_device(name: str) -> bool:
    """Whether reward `name` scores on device in the caller's process (a reward model or an
    LLM judge) rather than in the rule rewards' worker pool."""
    return is_model_reward(name) or is_judge_reward(name)


def check_rewards(cfg: RewardConfig, *, field: str | None = None) -> None:
    """Every reward name, option, `rm:` folder and `judge:` checkpoint checked, nothing loaded
    or started: for a run to fail on a typo before any model loads. `field`: what errors
    name as the source of a folder (default: the config field)."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.rewards.model import check_reward_model

    field = field or _field(cfg)
    configured_reward(cfg, field=field)
    for name in cfg.rewards():
        if is_model_reward(name):
            check_reward_model(model_folder(name), field)
        elif is_judge_reward(name):
            resolve_checkpoint(judge_folder(name), f"{field} {name!r}")


def build_reward_pool(cfg: RewardConfig, *, field: str | None = None) -> RewardPool:
    """A `RewardPool` of `cfg.workers` processes scoring with `configured_reward(cfg)`; every
    name and option is checked here, before any worker starts (errors name `field`, default
    the config field). Rule rewards only: a config naming an `rm:` reward model or a
    `judge:` needs `build_rewards`."""
    from jaxrl_llm.rewards.pool import RewardPool

    models = [name for name in cfg.rewards() if on_device(name)]
    if models:
        raise ConfigError(
            f"RewardConfig names reward model(s) or judge(s) {models}: this command scores "
            "with rule "
            "rewards only (pass@k needs a right-or-wrong check); `jaxrl-llm train` and "
            "`jaxrl-llm score` take reward models (docs/rewards.md, 'Reward models')"
        )
    rule = configured_reward(cfg, field=field)
    assert rule is not None
    return RewardPool(
        rule,
        num_workers=cfg.workers,
        timeout_s=cfg.timeout_s,
        timeout_value=cfg.incorrect,
        max_error_frac=cfg.max_error_frac,
    )


def device_reward_configs(cfg: RewardConfig) -> dict[str, RewardModelConfig | JudgeConfig]:
    """{name: its config} of each `rm:` and `judge:` reward `cfg` names: the shared
    `RewardConfig.model` or `.judge` with the reward's own options applied."""
    out: dict[str, RewardModelConfig | JudgeConfig] = {}
    for name, value in cfg.rewards().items():
        if on_device(name):
            base = cfg.model if is_model_reward(name) else cfg.judge
            out[name] = with_options(base, _options(value), f"reward {name!r}")
    return out


def build_rewards(
    cfg: RewardConfig, *, mesh: Mesh | None = None, judges: JudgeFactory | None = None
) -> RewardPool | ModelAndRuleRewards:
    """What scores samples, every name, option and folder checked before any worker starts
    or model loads: `build_reward_pool(cfg)` for rule rewards alone; with `rm:` or `judge:`
    rewards, `ModelAndRuleRewards` (the models and judges loaded on `mesh`, or the default
    devices, and the rule rewards' pool when there are any). `judges`: what builds a judge
    (`rollout.judge.build_judge`); None: a `judge:` reward is an error. Both have
    `score(responses, examples)`."""
    from jaxrl_llm.rewards.combined import ModelAndRuleRewards
    from jaxrl_llm.rewards.model import RewardModel

    check_rewards(cfg)
    names = [name for name in cfg.rewards() if on_device(name)]
    if not names:
        return build_reward_pool(cfg)
    if judges is None and any(is_judge_reward(n) for n in names):
        raise ConfigError(
            "an LLM judge ('judge:') is named, but this command takes reward models and rule "
            "rewards only; `jaxrl-llm train` and `jaxrl-llm score` take judges"
        )
    rules = {k: v for k, v in cfg.rewards().items() if not on_device(k)}
    scorers: list[tuple[Any, float]] = []
    try:
        for name, config in device_reward_configs(cfg).items():
            if isinstance(config, RewardModelConfig):
                scorer = RewardModel(model_folder(name), config, mesh=mesh)
            else:
                assert judges is not None
                scorer = judges(name, config, mesh)
            scorers.append((scorer, _weight(cfg.rewards()[name])))
        pool = None
        if rules:  # the rule rewards alone, under the same settings
            rule_cfg = dataclasses.replace(cfg, name=next(iter(rules)), weights=rules)
            pool = build_reward_pool(rule_cfg)
    except BaseException:
        for scorer, _ in scorers:
            scorer.close()
        raise
    return ModelAndRuleRewards(
        pool, scorers, incorrect=cfg.incorrect, max_error_frac=cfg.max_error_frac
    )

"""Bad configuration fails before anything compiles, and the message names the key."""

import pytest

from jaxrl_llm.config import ConfigError, parse_gin, resolve_gin_file
from jaxrl_llm.learner.rl_config import RLConfig


def test_shipped_configs_parse_and_validate():
    for name in ("grpo_tiny.gin", "ppo_tiny.gin", "limr_ppo_qwen2.5_math_7b.gin",
                 "torl_grpo_qwen2.5_math_1.5b.gin"):  # fmt: skip
        parse_gin([name])
        RLConfig().validate()


def test_unknown_parameter_is_named():
    with pytest.raises(ConfigError, match="lrr"):
        parse_gin([], ["OptimConfig.lrr = 0.1"])


def test_unknown_configurable_is_named():
    with pytest.raises(ConfigError, match="AlgoConfg"):
        parse_gin([], ["AlgoConfg.estimator = 'grpo'"])


def test_missing_gin_file():
    with pytest.raises(ConfigError, match=r"nope\.gin"):
        resolve_gin_file("nope.gin")


@pytest.mark.parametrize(
    ("binding", "named"),
    [
        ("AlgoConfig.estimator = 'grpoo'", "grpoo"),
        ("AlgoConfig.loss_agg = 'mean'", "mean"),
        ("AlgoConfig.kl_loss_kind = 'k9'", "k9"),
        ("AlgoConfig.mini_batches = 3", "mini_batches"),
        ("RolloutConfig.tool = 'calculator'", "rollout.tool"),
        ("RolloutConfig.n = 1", "rollout.n"),
        ("OptimConfig.decay = 'exp'", "decay"),
        ("OptimConfig.lr = -1.0", "lr"),
    ],
)
def test_bad_values_are_named(binding, named):
    with pytest.raises(ValueError, match=named):
        parse_gin(["grpo_tiny.gin"], [binding])
        RLConfig().validate()

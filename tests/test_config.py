"""Bad configuration fails before anything compiles, and the message names the key."""

import pytest

from jaxrl_llm.config import CONFIGS_DIR, ConfigError, parse_gin, resolve_gin_file
from jaxrl_llm.learner.rl_config import RLConfig

NOT_RL = {"base.gin", "sft_tiny.gin", "sft_tiny_stage2.gin"}  # include-only file, SFT configs


@pytest.mark.parametrize(
    "name", sorted(p.name for p in CONFIGS_DIR.glob("*.gin") if p.name not in NOT_RL)
)
def test_shipped_configs_parse_and_validate(name):
    parse_gin([name])
    cfg = RLConfig()
    cfg.validate()
    first_line = (CONFIGS_DIR / name).read_text().splitlines()[0]
    assert first_line.startswith("# jaxrl-llm train"), "configs start with their command"


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

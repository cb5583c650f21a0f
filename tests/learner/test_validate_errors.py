"""Every refusal of `RLConfig.validate` is a `ConfigError` (the CLI's one line, exit 2),
including the registries' unknown names and the cross-field rules."""

import dataclasses

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.rl_config import RLConfig


def _with(cfg: RLConfig, part: str, **changes) -> RLConfig:
    return dataclasses.replace(cfg, **{part: dataclasses.replace(getattr(cfg, part), **changes)})


@pytest.mark.parametrize(
    ("part", "changes", "match"),
    [
        ("algo", {"estimator": "grpoo"}, r"unknown advantage 'grpoo'"),
        ("algo", {"policy_loss": "ppoo"}, r"unknown policy_loss 'ppoo'"),
        ("algo", {"mini_batches": 3}, r"mini_batches = 3 does not divide"),
        ("rollout", {"n": 1}, r"needs rollout.n >= 2"),
        ("rollout", {"tool": "search"}, r"search"),
    ],
)
def test_each_refusal_is_a_config_error(part, changes, match):
    cfg = _with(RLConfig(), part, **changes)
    with pytest.raises(ConfigError, match=match):
        cfg.validate()


def test_partial_rollouts_without_overlap_is_a_config_error():
    with pytest.raises(ConfigError, match=r"partial_rollouts needs RLConfig.max_staleness"):
        dataclasses.replace(RLConfig(), partial_rollouts=True).validate()

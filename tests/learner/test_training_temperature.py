"""A training run samples at a temperature > 0: the PPO ratio is taken against the
sampling distribution's logprobs, log softmax(logits / temperature), which a temperature of
0 (greedy) does not have. Validation and `eval`/`generate` decode greedily at 0 as before."""

import dataclasses

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.rollout.config import RolloutConfig


def _with_rollout(**kw) -> RLConfig:
    return dataclasses.replace(RLConfig(), rollout=dataclasses.replace(RolloutConfig(), **kw))


def test_greedy_training_rollouts_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"RolloutConfig\.temperature = 0\.0.*temperature > 0"):
        _with_rollout(temperature=0.0).validate()


def test_greedy_validation_stays_valid():
    cfg = _with_rollout(temperature=0.7, val_temperature=0.0)
    cfg.validate()
    assert cfg.rollout.val_temperature == 0.0

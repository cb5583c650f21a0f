"""`RLConfig.val_reward`: validation scored by another reward than training (e.g. the math
rule while training against a reward model), checked and built apart from the training one."""

import types

import gin
import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner import rl_loop
from jaxrl_llm.learner.rl_config import RLConfig


@pytest.fixture(autouse=True)
def _no_bindings_left():
    yield
    gin.clear_config()


def test_validation_reward_replaces_the_training_reward_only_when_set():
    parse_gin(
        [], ["RewardConfig.weights = {'rm:/m': 1.0, 'math': 0.0}", "RewardConfig.correct = 2.0"]
    )
    cfg = RLConfig()
    assert cfg.validation_reward() is cfg.reward
    parse_gin([], ["RewardConfig.weights = {'rm:/m': 1.0}", "RLConfig.val_reward = 'math'",
                   "RewardConfig.correct = 2.0"])  # fmt: skip
    val = RLConfig().validation_reward()
    assert val.rewards() == {"math": 1.0} and val.correct == 2.0


def test_an_unknown_validation_reward_fails_validate():
    parse_gin([], ["RLConfig.val_reward = 'no_such_reward'"])
    with pytest.raises((ConfigError, ValueError, KeyError), match="no_such_reward"):
        RLConfig().validate()


def test_validation_scores_with_val_reward_when_built():
    used = []

    class Rollout:
        sync_weights = release_weights = staticmethod(lambda *a: None)

        def validate(self, val, reward, correct):
            used.append((reward, correct))
            return {"val/test_score": 1.0}

    run = types.SimpleNamespace(
        data=types.SimpleNamespace(val="val"), rollout=Rollout(), reward="train",
        val_reward=None, learner=types.SimpleNamespace(policy_params=lambda: None),
        cfg=types.SimpleNamespace(reward=types.SimpleNamespace(correct=1.0)),
    )  # fmt: skip
    rl_loop._validate(run, None)
    run.val_reward = "rule"
    rl_loop._validate(run, None)
    assert used == [("train", 1.0), ("rule", 1.0)]

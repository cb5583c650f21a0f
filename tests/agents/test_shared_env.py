"""`SharedEnvFactory`: the episodes of a run share one resource, built once (at start-up)
and closed once, when the run ends or fails (by the rollout stage, as it closes a tool)."""

from typing import ClassVar

import pytest

from jaxrl_llm.agents import SharedEnvFactory, StepResult
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.stage import RolloutStage

HERE = "tests.agents.test_shared_env"


class _Pool:
    """A resource that counts how often it is built and closed."""

    log: ClassVar[list[str]] = []

    def __init__(self):
        self.log.append("open")

    def close(self):
        self.log.append("close")


class _Env:
    tools = ()

    def __init__(self, pool):
        self.pool = pool

    def reset(self, row):
        return [{"role": "user", "content": str(row)}]

    def step(self, turn):
        return StepResult(done=True)

    def close(self):  # an episode's own close leaves the shared pool open
        pass


make_env = SharedEnvFactory(_Pool, _Env)  # replaced per test (a closed factory stays closed)


def _broken_backend(ctx):
    raise ValueError("no sampler here")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    _Pool.log = []
    monkeypatch.setattr(f"{HERE}.make_env", SharedEnvFactory(_Pool, _Env))


def test_episodes_share_one_resource_closed_once():
    factory = SharedEnvFactory(_Pool, _Env)
    first, second = factory(), factory()
    assert first.pool is second.pool and _Pool.log == ["open"]
    factory.close()
    factory.close()
    assert _Pool.log == ["open", "close"]
    with pytest.raises(RuntimeError, match="closed: its run has ended"):
        factory()


@pytest.mark.parametrize("backend", ["tests.rollout.test_reward_metrics:ScriptedSampler",
                                     f"{HERE}:_broken_backend"])  # fmt: skip
def test_the_rollout_stage_closes_what_the_episodes_share(backend):
    """Built at start-up by the contract check's episode, closed when the stage closes,
    and also when building the stage fails after the factory (its sampler cannot start)."""
    cfg = RolloutConfig(backend=backend, env=f"{HERE}:make_env")
    if backend.endswith("_broken_backend"):
        with pytest.raises(ValueError, match="no sampler here"):
            RolloutStage(cfg, None, None, None, max_prompt_length=4, seed=0)
    else:
        stage = RolloutStage(cfg, None, None, None, max_prompt_length=4, seed=0)
        assert _Pool.log == ["open"]
        stage.close()
    assert _Pool.log == ["open", "close"]


def test_a_factory_that_fails_the_contract_check_is_closed(monkeypatch):
    bad = SharedEnvFactory(_Pool, lambda pool: object())
    monkeypatch.setattr(f"{HERE}.make_env", bad)
    with pytest.raises(TypeError, match="without the environment contract"):
        RolloutStage(RolloutConfig(env=f"{HERE}:make_env"), None, None, None,
                     max_prompt_length=4, seed=0)  # fmt: skip
    assert _Pool.log == ["open", "close"]

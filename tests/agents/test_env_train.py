"""A user environment with two tools, by import path, through a whole RL run (`run_rl`):
prompts rendered with its tools, episodes scored by it, its metrics logged, every
environment closed; the built-in `arithmetic` environment the same way on validation."""

from pathlib import Path

import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.testing import register_test_rewards
from tests.learner.rl_helpers import TINY_RL_PARAMS

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


@pytest.mark.parametrize("env", ["env_example:make_env", "arithmetic"])
def test_an_environment_runs_the_loop(tmp_path, monkeypatch, env):
    monkeypatch.syspath_prepend(str(HERE))  # as PYTHONPATH=. does for a user's module
    register_test_rewards()  # 'digit_fraction', named by TINY_RL_PARAMS (unused: env rewards)
    params = [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{tmp_path}'", "RLConfig.save_every = 0",
              "RLConfig.steps = 2", "RLConfig.eval_every = 2", "DataConfig.val_size = 2",
              "DataConfig.max_prompt_length = 224", f"RolloutConfig.env = '{env}'",
              "EpisodeConfig.reward_rule = 'sum'"]  # fmt: skip
    parse_gin([], params)
    records = run_rl(RLConfig())
    assert [r["step"] for r in records] == [0, 1, 2]
    last = records[-1]
    tools = ("lookup", "count_letters") if env.startswith("env_example") else ("add", "divide")
    for name in tools:
        assert f"tools/{name}/calls" in last and f"val/tools/{name}/calls" in last
    for key in ("env/turns/mean", "env/well_formed_share", "env/reward/mean"):
        assert key in last and f"val/{key}" in records[0]
    assert last["env/turns/mean"] >= 1
    assert 0 <= last["val/test_score"] <= 1

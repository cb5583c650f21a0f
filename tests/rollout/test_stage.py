"""The rollout stage in a real RL run: plug-in rewards see the data row, their errors are
counted per step and stop a run past `max_error_frac`, a plug-in tool is used (by a scripted
policy: the tiny model never writes its call), and each step's generations are readable."""

import math
from pathlib import Path

import pytest

from jaxrl_llm import cli
from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.metrics.generations import read_generations
from jaxrl_llm.rewards import RewardErrors
from tests.learner.rl_helpers import TINY_RL_PARAMS
from tests.rollout.scripted import script_the_engine

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


@pytest.fixture
def plugins_on_path(monkeypatch):
    """The docs' example reward and tool modules importable by name, as PYTHONPATH does."""
    monkeypatch.syspath_prepend(str(HERE.parent / "rewards"))
    monkeypatch.syspath_prepend(str(HERE.parent / "tools"))


def _config(run_dir, *extra):
    params = [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{run_dir}'", "RLConfig.save_every = 0"]
    parse_gin([], [*params, "RLConfig.steps = 2", *extra])
    return RLConfig()


def test_plugin_reward_errors_are_counted_and_generations_logged(
    tmp_path, plugins_on_path, monkeypatch, capsys
):
    # The built-in task's rows have no "unit" column: math_with_unit raises on every sample
    # (counted, not fatal with max_error_frac = 1), so no sample has a score of brevity's
    # either: a sample whose reward raised has no part scores (rewards/pool.py).
    # Each sample calls the plug-in calculator once, then answers with its result.
    script_the_engine(monkeypatch, ["<calc>6 * 7</calc>", "So the answer is 42."])
    cfg = _config(
        tmp_path / "run",
        "RewardConfig.weights = {'example_reward:math_with_unit': 1.0,"
        " 'example_reward:brevity': 0.5}",
        "RewardConfig.name = 'math'",  # TINY_RL_PARAMS names another; weights replace it
        "RewardConfig.max_error_frac = 1.0",
        "RolloutConfig.tool = 'example_tool:make_calculator'",
        "RLConfig.log_generations = 3",
        "RolloutConfig.max_new_tokens = 64",  # the call, its result and the answer
    )
    records = run_rl(cfg)
    batch = cfg.data.prompts_per_step * cfg.rollout.n
    assert [r["reward/errors"] for r in records] == [batch, batch]
    assert [r["reward/timeouts"] for r in records] == [0, 0]
    for r in records:
        assert math.isnan(r["reward/example_reward:brevity/mean"]), r
        assert r["env/tool_calls/mean"] == 1, r
    for step in (1, 2):
        got, samples = read_generations(tmp_path / "run", step)
        assert got == step and len(samples) == 3
        for s in samples:
            assert s["prompt"] and s["response"] and s["reward"] == 0.0  # errors score incorrect
            assert s["finish_reason"] in ("eos", "length", "stop")
            # the call, the calculator's answer appended after it, the policy going on
            assert "<calc>6 * 7</calc>\n<result>42</result>\nSo the answer" in s["response"], s
    assert cli.main(["samples", str(tmp_path / "run"), "--limit", "1"]) == 0
    assert "=== step 2 · prompt" in capsys.readouterr().out


def test_a_run_stops_when_most_of_a_batch_errors(tmp_path, plugins_on_path):
    cfg = _config(tmp_path / "stop", "RewardConfig.name = 'example_reward:math_with_unit'")
    with pytest.raises(RewardErrors, match=r"raised on 8 of 8 samples.*KeyError: 'unit'"):
        run_rl(cfg)

"""Reward plug-ins by import path, weighted combinations from config, and reward errors
counted, logged once per type, and stopping a batch past `max_error_frac`."""

import logging
import re
from pathlib import Path

import gin
import numpy as np
import pytest

from jaxrl_llm.rewards import RewardErrors, build_reward
from jaxrl_llm.rewards.config import RewardConfig, build_reward_pool, configured_reward

HERE = Path(__file__).parent
DOC = HERE.parents[1] / "docs" / "rewards.md"
BOXED_12_CM = r"The perimeter is \boxed{12} cm."
ROW = {"id": "q1", "prompt": "A side is 3 cm; the perimeter of the square?", "answer": "12"}


@pytest.fixture
def on_path(monkeypatch):
    """The example module importable as `example_reward`, as `PYTHONPATH=.` does for a user;
    spawned reward workers inherit the path. The tests build `RewardConfig`s directly, so no
    binding an earlier test parsed may fill their unset fields."""
    gin.clear_config()
    monkeypatch.syspath_prepend(str(HERE))


def test_the_docs_show_the_example_module_verbatim():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert (HERE / "example_reward.py").read_text() in blocks


def test_docs_worked_example_runs_through_the_pool(on_path):
    cfg = RewardConfig(
        weights={"example_reward:math_with_unit": 1.0, "example_reward:brevity": 0.1},
        workers=2,
    )
    rows = [
        {**ROW, "unit": "cm"},  # right answer and unit: 1.0 + 0.1
        {**ROW, "unit": "kg"},  # unit missing from the response: 0.0 + 0.1
        {**ROW, "unit": "cm", "max_chars": 20},  # 31 chars, 11 over 20: 1 + 0.1 * (1 - 11/20)
        {**ROW, "answer": "13", "unit": "cm"},  # wrong answer
    ]
    with build_reward_pool(cfg) as pool:
        scores = pool.score([BOXED_12_CM] * 4, rows)
        assert pool.last_failures == {}
    expected = [1.1, 0.1, 1.0 + 0.1 * (1 - 11 / 20), 0.1]
    assert len(BOXED_12_CM) == 31
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12)


@pytest.mark.slow  # 8 s in a loaded 2-worker run, AMD EPYC AVX2
def test_a_path_takes_only_the_options_it_declares(on_path):
    cfg = RewardConfig(name="example_reward:brevity", correct=5.0)  # brevity declares none
    with build_reward_pool(cfg) as pool:
        assert pool.score(["x" * 800], [ROW]) == [0.0]
    unit = RewardConfig(name="example_reward:math_with_unit", correct=5.0, incorrect=-2.0)
    with build_reward_pool(unit) as pool:
        rows = [{**ROW, "unit": "cm"}, {**ROW, "unit": "kg"}]
        assert pool.score([BOXED_12_CM] * 2, rows) == [5.0, -2.0]


def test_weights_from_gin_with_per_reward_options(on_path):
    gin.clear_config()
    try:
        gin.parse_config(
            'RewardConfig.weights = {"math": 1.0, "format": (0.5, {"style": "think_answer"}),'
            ' "example_reward:brevity": 0.25}\n'
            "RewardConfig.incorrect = -1.0\n"
        )
        cfg = RewardConfig()
    finally:
        gin.clear_config()
    reward = configured_reward(cfg)
    components = reward.components("<think>a</think><answer>12</answer>", ROW)
    assert components == {"math": -1.0, "format": 1.0, "example_reward:brevity": 1.0}
    np.testing.assert_allclose(reward("<think>a</think><answer>12</answer>", ROW), -0.25)


def test_bad_names_and_settings_fail_at_start_with_what_is_expected(on_path):
    with pytest.raises(ImportError, match=r"reward = 'example_reward:nope'.*PYTHONPATH"):
        build_reward("example_reward:nope")
    with pytest.raises(ImportError, match=r"reward = 'no_such_module:f': cannot import"):
        build_reward("no_such_module:f")
    with pytest.raises(TypeError, match=r"'example_reward:brevity' cannot be called.*limit"):
        build_reward("example_reward:brevity", limit=3)
    with pytest.raises(ValueError, match=r"max_error_frac = 1.5: expected a fraction"):
        RewardConfig(max_error_frac=1.5)
    with pytest.raises(ValueError, match=r"name = 'exact_match' is not among"):
        RewardConfig(name="exact_match", weights={"math": 1.0})
    with pytest.raises(ValueError, match=r"weights = \{\}"):
        RewardConfig(weights={})


def test_reward_errors_are_counted_logged_once_and_stop_past_the_limit(on_path, caplog):
    cfg = RewardConfig(name="example_reward:math_with_unit", workers=2, max_error_frac=0.5)
    good, bad = {**ROW, "unit": "cm"}, dict(ROW)  # no "unit" column: KeyError in the reward
    with build_reward_pool(cfg) as pool, caplog.at_level(logging.ERROR):
        scores = pool.score([BOXED_12_CM] * 4, [good, bad, bad, good])
        assert scores == [1.0, 0.0, 0.0, 1.0]
        assert sorted(pool.last_failures) == [1, 2]
        failure = pool.last_failures[1]
        assert (failure.kind, failure.error_type) == ("error", "builtins.KeyError")
        assert "example_reward.py" in failure.traceback and "unit" in failure.traceback
        pool.check_errors(2, 4, str(failure))  # exactly half: allowed
        with pytest.raises(RewardErrors, match=r"raised on 3 of 4 samples.*KeyError: 'unit'"):
            pool.check_errors(3, 4, str(failure))
        pool.score([BOXED_12_CM], [bad])  # the same exception type again: not logged again
    logged = [r for r in caplog.records if "the reward raised" in r.getMessage()]
    assert len(logged) == 1 and "KeyError" in logged[0].getMessage()

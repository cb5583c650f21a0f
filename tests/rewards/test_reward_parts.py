"""Each reward of a combination broken down (`Scorer.last_parts`, issue #31 item 3): every
part's scores equal that reward scoring alone (rule + rule, rule + rm:, rm alone, a single
rule reward), a failed sample has no part scores, the pool and the models overlap, and the
overlapped sum equals the one-after-the-other sum exactly."""

import threading
import time

import numpy as np
import pytest

from jaxrl_llm.rewards.combined import ModelAndRuleRewards
from jaxrl_llm.rewards.config import RewardConfig, build_rewards
from jaxrl_llm.rewards.model import RewardModel
from jaxrl_llm.rewards.model_config import RewardModelConfig, metric_names
from jaxrl_llm.rewards.pool import RewardPart, RewardPool
from jaxrl_llm.rewards.registry import build_reward, combine_rewards
from jaxrl_llm.testing import write_reward_model
from tests.rewards.example_reward import brevity

ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "5", "unit": "cm"},
    {"prompt": "Name a colour.", "answer": "blue", "unit": "m"},
    {"prompt": "What is 6 * 7?", "answer": "42", "unit": "kg"},
    {"prompt": "Say nothing.", "answer": "", "unit": "s"},
]
RESPONSES = [r"It is \boxed{5} cm.", "Blue, surely.", r"\boxed{41} kg", ""]


def _alone(name: str, **options) -> np.ndarray:
    reward = build_reward(name, **options)
    return np.asarray([reward(r, e) for r, e in zip(RESPONSES, ROWS, strict=True)])


def test_rule_plus_rule_parts_are_each_reward_alone():
    """The pool's breakdown of {"math": 1.0, brevity: 0.25}, and its total unchanged."""
    brevity = "tests.rewards.example_reward:brevity"
    combined = combine_rewards({"math": 1.0, brevity: (0.25, {"max_chars": 8})})
    with RewardPool(combined, num_workers=2) as pool:
        got = pool.score(RESPONSES, ROWS)
        parts = pool.last_parts
    assert list(parts) == ["math", brevity]
    np.testing.assert_array_equal(parts["math"].scores, _alone("math"))
    np.testing.assert_array_equal(parts[brevity].scores, _alone(brevity, max_chars=8))
    assert got == [combined(r, e) for r, e in zip(RESPONSES, ROWS, strict=True)]
    assert all(p.seconds > 0 for p in parts.values())


def test_a_single_rule_reward_and_a_failed_sample():
    """One reward still has its part; a sample whose reward raised has none (NaN)."""
    unit = "tests.rewards.example_reward:math_with_unit"
    rows = [ROWS[0], {"prompt": "x", "answer": "1"}]  # the second row has no 'unit': raises
    with RewardPool(build_reward(unit), num_workers=1) as pool:
        pool.score(RESPONSES[:2], rows)
        (part,) = pool.last_parts.values()
        assert list(pool.last_parts) == [unit] and set(pool.last_failures) == {1}
    np.testing.assert_array_equal(part.scores, [1.0, np.nan])


def test_a_plain_function_has_no_parts():
    with RewardPool(brevity, num_workers=1) as pool:  # any fn(response, example)
        assert pool.score(["ab"], [{}]) == [1.0] and pool.last_parts == {}


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("skywork") / "my-rm"
    write_reward_model(path, "qwen2", seed=3)
    return path


def test_rule_plus_rm_parts_and_the_overlapped_sum(rm_folder):
    """{"math": 1.0, "rm:<folder>": (0.5, sigmoid)}: the parts are "math" and
    "rm:my-rm", each equal to the reward alone; the total equals the sequential
    pool-then-model sum bit for bit."""
    weights = {"math": 1.0, f"rm:{rm_folder}": (0.5, {"normalize": "sigmoid"})}
    model = RewardModel(rm_folder, RewardModelConfig(normalize="sigmoid"))
    alone = model.score(RESPONSES, ROWS)
    with build_rewards(RewardConfig(weights=weights, workers=1)) as mixed:
        assert isinstance(mixed, ModelAndRuleRewards) and mixed.pool is not None
        got = mixed.score(RESPONSES, ROWS)
        parts = mixed.last_parts
        sequential = np.zeros(len(RESPONSES), np.float32)
        sequential += np.asarray(mixed.pool.score(RESPONSES, ROWS), np.float32)
        sequential += np.float32(0.5) * model.score(RESPONSES, ROWS)
    assert list(parts) == ["math", "rm:my-rm"]
    np.testing.assert_array_equal(parts["math"].scores, _alone("math", incorrect=0.0))
    np.testing.assert_array_equal(parts["rm:my-rm"].scores, alone)
    np.testing.assert_array_equal(got, sequential)
    assert parts["rm:my-rm"].seconds > 0 and parts["math"].seconds > 0


def test_rm_alone_reports_its_part(rm_folder):
    with build_rewards(RewardConfig(name=f"rm:{rm_folder}/")) as alone:
        got = alone.score(RESPONSES, ROWS)
        (name,) = alone.last_parts
        assert name == "rm:my-rm"
        np.testing.assert_array_equal(alone.last_parts[name].scores, got)
    np.testing.assert_array_equal(got, RewardModel(rm_folder).score(RESPONSES, ROWS))


class _Pool:
    """A pool whose `score` waits until the model has started scoring: it returns only
    when the two run at the same time."""

    def __init__(self, model_started: threading.Event):
        self.model_started = model_started
        self.last_parts = {"rule": RewardPart(np.ones(2), 0.0)}
        self.last_failures = {}
        self.timeout_value, self.max_error_frac = -1.0, 0.5  # a failed sample's score, stop rule

    def score(self, responses, examples):
        assert self.model_started.wait(10), "the model did not score while the pool ran"
        return [1.0, 2.0]


class _Model:
    name = "rm:/models/a/rm"

    def __init__(self, started: threading.Event):
        self.started = started

    def score(self, responses, examples):
        self.started.set()
        time.sleep(0.05)  # still scoring when the pool returns
        return np.asarray([0.5, 0.25], np.float32)


def test_pool_and_models_overlap_and_errors_reach_the_caller():
    started = threading.Event()
    rewards = ModelAndRuleRewards(_Pool(started), [(_Model(started), 2.0)])  # pyright: ignore[reportArgumentType]
    np.testing.assert_array_equal(rewards.score(["a", "b"], [{}, {}]), [2.0, 2.5])
    assert list(rewards.last_parts) == ["rule", "rm:rm"]

    class Broken(_Pool):
        def score(self, responses, examples):
            raise RuntimeError("pool is gone")

    rewards = ModelAndRuleRewards(Broken(started), [(_Model(started), 1.0)])  # pyright: ignore[reportArgumentType]
    with pytest.raises(RuntimeError, match="pool is gone"):
        rewards.score(["a", "b"], [{}, {}])


def test_metric_names_are_short_unless_two_models_share_a_folder_name():
    assert metric_names(["math", "rm:/models/skywork/", "rm:rel/rm-a"]) == {
        "math": "math",
        "rm:/models/skywork/": "rm:skywork",
        "rm:rel/rm-a": "rm:rm-a",
    }
    assert metric_names(["rm:/a/rm", "rm:/b/rm"]) == {
        "rm:/a/rm": "rm:/a/rm",
        "rm:/b/rm": "rm:/b/rm",
    }

"""A reward that returns NaN, inf or a non-number fails that sample exactly as a reward that
raised: recorded in `last_failures`, scored `incorrect`, counted; so does a device scorer's
(a reward model's or judge's) NaN or inf through `ModelAndRuleRewards`; `jaxrl-llm score`
prints strict JSON with an `error` field and exits 1."""

import json
import math
import textwrap

import gin
import numpy as np
import pytest

from jaxrl_llm import cli
from jaxrl_llm.rewards import RewardErrors, RewardPool, build_reward, combine_rewards
from jaxrl_llm.rewards.combined import ModelAndRuleRewards
from jaxrl_llm.rewards.config import RewardConfig
from jaxrl_llm.rollout.scoring import RewardCounts

BAD_REWARDS = textwrap.dedent(
    """
    def nan_reward(response, example):
        return float("nan") if response == "bad" else 1.0

    def inf_reward(response, example):
        return float("inf") if response == "bad" else 1.0

    def neg_inf_reward(response, example):
        return float("-inf") if response == "bad" else 1.0

    def text_reward(response, example):
        return "high" if response == "bad" else 1.0

    def none_reward(response, example):
        return None if response == "bad" else 1.0

    def raising_reward(response, example):
        if response == "bad":
            raise RuntimeError("boom")
        return 1.0
    """
)
# (function, what the error message must show of the value it returned)
NON_FINITE = [("nan_reward", "nan"), ("inf_reward", "inf"), ("neg_inf_reward", "-inf")]
NON_NUMBER = [("text_reward", "'high'"), ("none_reward", "None")]


@pytest.fixture
def bad_rewards(tmp_path, monkeypatch):
    """The module `bad_rewards` importable here and in the pool's spawned workers."""
    (tmp_path / "bad_rewards.py").write_text(BAD_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "bad_rewards"


@pytest.mark.parametrize(("fn", "shown"), NON_FINITE + NON_NUMBER)
def test_a_reward_returning_a_non_finite_or_non_number_raises_naming_it(bad_rewards, fn, shown):
    name = f"{bad_rewards}:{fn}"
    reward = build_reward(name)
    assert reward("good", {}) == 1.0
    with pytest.raises((ValueError, TypeError)) as err:
        reward("bad", {})
    assert repr(name) in str(err.value) and shown in str(err.value)


@pytest.mark.parametrize(("fn", "shown"), NON_FINITE + NON_NUMBER)
def test_the_pool_fails_the_sample_as_a_raising_reward(bad_rewards, fn, shown):
    name = f"{bad_rewards}:{fn}"
    with RewardPool(build_reward(name), num_workers=1, timeout_s=30.0, timeout_value=-3.0) as pool:
        assert pool.score(["good", "bad", "good"], [{}, {}, {}]) == [1.0, -3.0, 1.0]
        assert list(pool.last_failures) == [1]
        failure = pool.last_failures[1]
        assert failure.kind == "error" and "Traceback" in failure.traceback
        assert repr(name) in failure.message and shown in failure.message
        assert math.isnan(pool.last_parts[name].scores[1])  # no part score, as when raised
        with pytest.raises(RuntimeError, match="raised on 1 of 1 samples"):
            pool.check_errors(1, 1, failure.message)  # counted towards max_error_frac


def test_the_pool_fails_a_plain_function_returning_nan(bad_rewards):
    import bad_rewards as module

    with RewardPool(module.nan_reward, num_workers=1, timeout_s=30.0) as pool:
        assert pool.score(["bad", "good"], [{}, {}]) == [-1.0, 1.0]
        failure = pool.last_failures[0]
        assert failure.kind == "error" and "nan_reward" in failure.message
        assert "nan" in failure.message


def test_a_combination_with_a_nan_part_fails_the_sample(bad_rewards):
    name = f"{bad_rewards}:nan_reward"
    reward = combine_rewards({name: 1.0, f"{bad_rewards}:inf_reward": 0.5})
    with RewardPool(reward, num_workers=1, timeout_s=30.0, timeout_value=-2.0) as pool:
        assert pool.score(["bad", "good"], [{}, {}]) == [-2.0, 1.5]
        assert pool.last_failures[0].kind == "error"
        assert repr(name) in pool.last_failures[0].message


def _strict(line: str) -> dict:
    def refuse(constant):
        raise ValueError(f"invalid JSON constant {constant} in {line!r}")

    return json.loads(line, parse_constant=refuse)


@pytest.mark.parametrize("fn", ["nan_reward", "inf_reward", "raising_reward"])
def test_score_prints_strict_json_with_an_error_and_exits_1(bad_rewards, fn, tmp_path, capsys):
    rows = [{"prompt": "q", "response": r} for r in ("bad", "good")]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        code = cli.main(["score", "--reward", f"{bad_rewards}:{fn}", "--data", str(data),
                         "--gin_param", "RewardConfig.workers = 1",
                         "--gin_param", "RewardConfig.incorrect = -0.5"])  # fmt: skip
    finally:
        gin.clear_config()
    lines = [_strict(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1
    assert [(r["row"], r["score"]) for r in lines] == [(1, -0.5), (2, 1.0)]
    shown = "boom" if fn == "raising_reward" else f"{bad_rewards}:{fn}"
    assert shown in lines[0]["error"] and "error" not in lines[1]


def test_score_turns_a_non_finite_score_from_outside_the_pool_into_an_error(
    monkeypatch, tmp_path, capsys
):
    """A scorer other than the rule pool (a reward model) that gives NaN: the row has an
    `error` and scores `incorrect`; the output stays strict JSON."""
    import contextlib

    from jaxrl_llm.rewards import config

    class NanScorer:
        last_failures = property(lambda self: {})

        def score(self, responses, examples):
            return [float("nan"), 0.25][: len(responses)]

    monkeypatch.setattr(
        config, "build_rewards", lambda cfg, judges: contextlib.nullcontext(NanScorer())
    )
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": "q", "response": r}) + "\n" for r in "ab"))
    try:
        code = cli.main(["score", "--reward", "math", "--data", str(data),
                         "--gin_param", "RewardConfig.incorrect = -0.5"])  # fmt: skip
    finally:
        gin.clear_config()
    lines = [_strict(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1 and [r["score"] for r in lines] == [-0.5, 0.25]
    assert "nan" in lines[0]["error"] and "error" not in lines[1]


class FixedScorer:
    """A device scorer double (a reward model's or LLM judge's interface: `name`, `score`,
    `close`) that gives fixed scores, the first len(responses) of `scores`."""

    def __init__(self, name: str, scores):
        self.name, self.scores = name, np.asarray(scores, np.float32)

    def score(self, responses, examples):
        return self.scores[: len(responses)]

    def close(self):
        pass


BAD_VALUES = [("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf"))]


@pytest.mark.parametrize(("shown", "bad"), BAD_VALUES)
def test_a_device_scorer_s_non_finite_score_fails_the_sample_as_a_raising_reward(shown, bad):
    """A reward model giving NaN or +/-inf on sample 1: that sample scores `incorrect`
    (RewardConfig's default without a pool), is in `last_failures` as an "error" naming the
    scorer and the sample, has no score from that scorer, and counts towards
    `max_error_frac`; the other samples and the other scorer's part are untouched."""
    rm = FixedScorer("rm:/models/a/rm", [0.5, bad, -0.25])
    judge = FixedScorer("judge:/models/j", [1.0, 0.75, 0.0])
    with ModelAndRuleRewards(None, [(rm, 2.0), (judge, 0.5)]) as rewards:
        got = rewards.score(["a", "b", "c"], [{}, {}, {}])
    ok = np.float32(2.0) * rm.scores + np.float32(0.5) * judge.scores  # the documented order
    np.testing.assert_array_equal(got, [ok[0], RewardConfig().incorrect, ok[2]])
    assert list(rewards.last_failures) == [1]
    failure = rewards.last_failures[1]
    assert failure.kind == "error"
    assert "'rm:/models/a/rm'" in failure.message and "sample 1" in failure.message
    assert f"returned {shown} " in failure.message
    assert np.isnan(rewards.last_parts["rm:rm"].scores[1])  # no score, as a raised sample
    np.testing.assert_array_equal(rewards.last_parts["judge:j"].scores, judge.scores)
    counts = RewardCounts.of(rewards, 3)
    assert (counts.errors, counts.timeouts, counts.first_error) == (1, 0, str(failure))
    rewards.check_errors(1, 3, str(failure))  # 1 of 3 <= max_error_frac 0.5: goes on
    with pytest.raises(RewardErrors, match="on 1 of 1 samples"):
        rewards.check_errors(1, 1, str(failure))


def test_a_weighted_total_beyond_float32_fails_its_sample():
    """Every part a finite score, but 2 x 3e38 is beyond float32: that sample fails (it was
    inf, then NaN advantages); the others keep their totals."""
    rm = FixedScorer("rm:/models/a/rm", [0.5, 3e38, -0.25])
    with ModelAndRuleRewards(None, [(rm, 2.0)]) as rewards:
        got = rewards.score(["a", "b", "c"], [{}, {}, {}])
    np.testing.assert_array_equal(got, [1.0, RewardConfig().incorrect, -0.5])
    assert list(rewards.last_failures) == [1]
    assert "beyond float32" in rewards.last_failures[1].message


def test_a_scorer_failure_beside_the_rule_pool_s_scores_incorrect_and_both_are_reported(
    bad_rewards,
):
    """Rule pool (`incorrect` = -3: its `timeout_value`) + a reward model: the rule reward
    raises on sample 1, the model gives NaN on sample 2. Both samples score -3 (a failed
    sample scores `incorrect`, never `incorrect` plus another reward's score), both are in
    `last_failures`, sorted, and counted."""
    rm = FixedScorer("rm:/models/a/rm", [0.5, 0.25, float("nan")])
    pool = RewardPool(
        build_reward(f"{bad_rewards}:raising_reward"), num_workers=1, timeout_s=30.0,
        timeout_value=-3.0,
    )  # fmt: skip
    with ModelAndRuleRewards(pool, [(rm, 2.0)]) as rewards:
        got = rewards.score(["good", "bad", "good"], [{}, {}, {}])
        failures = rewards.last_failures
    np.testing.assert_array_equal(got, [np.float32(1.0) + np.float32(2.0) * 0.5, -3.0, -3.0])
    assert list(failures) == [1, 2]
    assert "boom" in failures[1].message
    assert "'rm:/models/a/rm'" in failures[2].message and "sample 2" in failures[2].message
    assert RewardCounts.of(rewards, 3).errors == 2


def test_score_names_the_scorer_and_the_sample_of_a_non_finite_model_score(
    monkeypatch, tmp_path, capsys
):
    """`jaxrl-llm score` with a reward model giving inf on row 2: the row's `error` names the
    model and the sample (the failure `ModelAndRuleRewards` records), score `incorrect`."""
    from jaxrl_llm.rewards import config

    rm = FixedScorer("rm:/models/a/rm", [0.25, float("inf")])
    monkeypatch.setattr(
        config, "build_rewards", lambda cfg, judges: ModelAndRuleRewards(None, [(rm, 1.0)])
    )
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": "q", "response": r}) + "\n" for r in "ab"))
    try:
        code = cli.main(["score", "--reward", "math", "--data", str(data)])
    finally:
        gin.clear_config()
    lines = [_strict(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1 and [r["score"] for r in lines] == [0.25, RewardConfig().incorrect]
    assert "'rm:/models/a/rm'" in lines[1]["error"] and "sample 1" in lines[1]["error"]
    assert "error" not in lines[0]

"""A reward that returns NaN, inf or a non-number fails that sample exactly as a reward that
raised: recorded in `last_failures`, scored `incorrect`, counted; `jaxrl-llm score` prints
strict JSON with an `error` field and exits 1."""

import json
import math
import textwrap

import gin
import pytest

from jaxrl_llm import cli
from jaxrl_llm.rewards import RewardPool, build_reward, combine_rewards

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

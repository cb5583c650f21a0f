"""GRPO against a reward model: `RewardConfig.name = 'rm:<folder>'` scores every sample of
the RL loop with the model, on device, and those scores are the step's rewards."""

import numpy as np
import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.rewards import model as rm_lib
from jaxrl_llm.testing import FLOAT32_EPS, register_test_rewards, write_reward_model

from .rl_helpers import TINY_RL_PARAMS
from .test_experience import _mean_tolerance

pytestmark = pytest.mark.slow  # an RL step: minutes of compilation on 2 shared cores


def _config(run_dir, reward: str) -> RLConfig:
    parse_gin([], [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{run_dir}'", "RLConfig.steps = 1",
                   f"RewardConfig.name = '{reward}'"])  # fmt: skip
    return RLConfig()


def test_a_run_rewards_with_the_model_scores(tmp_path, monkeypatch):
    folder = tmp_path / "rm"
    write_reward_model(folder)
    calls = []
    score = rm_lib.RewardModel.score

    def recorded(self, responses, examples):
        out = score(self, responses, examples)
        calls.append((list(responses), list(examples), out))
        return out

    monkeypatch.setattr(rm_lib.RewardModel, "score", recorded)
    [last] = run_rl(_config(tmp_path / "run", f"rm:{folder}"))
    scores = np.concatenate([out for _, _, out in calls])
    assert scores.size == 8  # prompts_per_step x n, each sample scored once
    # two float32 means of the same scores, summed in another order (sample vs call order)
    every = np.ones(scores.size)
    assert abs(last["critic/score/mean"] - scores.mean()) <= _mean_tolerance(scores, every)
    # The scores are the model's on the rows the stage passed: a fresh load, scoring each
    # call's rows as that call did, agrees within the parity bar (1e-4 of the
    # largest score; the scoring ran beside decoding on another thread).
    fresh = rm_lib.RewardModel(folder)
    for responses, examples, out in list(calls):  # (fresh.score records too)
        again = fresh.score(responses, examples)
        assert np.abs(again - out).max() <= 1e-4 * np.abs(out).max(), (again, out)
        assert all("prompt" in e or "messages" in e for e in examples)


def test_a_bad_reward_model_folder_fails_before_the_policy_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"RewardConfig\.name .*missing.*no such folder"):
        _config(tmp_path / "run", f"rm:{tmp_path / 'missing'}").validate()


def test_a_run_rewards_with_a_judge_beside_a_rule(tmp_path, monkeypatch):
    """`judge:builtin` (the shipped checkpoint as an LLM judge, on its own JAX engine) beside
    a rule reward: every sample is judged once, scoring beside the policy's decoding on the
    scorer thread, and the step reports the judge's mean and counts as the judge made them.

    The tiny judge writes no rating of its own, so every other first verdict (counted over
    the run's calls, however the rollout batches them) is replaced by "Score: 7/10" after
    the judge's engine wrote it: parsed verdicts and unparsed ones (re-asked, then
    `unparsed_score`) both reach the step's scores."""
    from jaxrl_llm.rewards.judge_config import parse_verdict
    from jaxrl_llm.rollout import judge as judge_lib

    calls, asked = [], []
    score, ask = judge_lib.Judge.score, judge_lib.Judge._ask

    def recorded(self, responses, examples):
        out = score(self, responses, examples)
        calls.append((out, dict(self.last_counts), list(self.last_verdicts), self.config))
        return out

    def rated(self, prompts, attempt):
        texts = ask(self, prompts, attempt)  # the judge's engine still writes each verdict
        if attempt == 0:
            texts = [t if (len(asked) + k) % 2 else "Score: 7/10" for k, t in enumerate(texts)]
            asked.extend(texts)
        return texts

    monkeypatch.setattr(judge_lib.Judge, "score", recorded)
    monkeypatch.setattr(judge_lib.Judge, "_ask", rated)
    register_test_rewards()  # 'digit_fraction'
    judge = ("(0.5, {'max_new_tokens': 4, 'retries': 1, 'parser': 'number', 'scale': 10,"
             " 'unparsed_score': 0.25})")  # fmt: skip
    weights = f"{{'digit_fraction': 1.0, 'judge:builtin': {judge}}}"
    parse_gin([], [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{tmp_path / 'run'}'",
                   "RLConfig.steps = 1", f"RewardConfig.weights = {weights}"])  # fmt: skip
    [last] = run_rl(RLConfig())
    judged = np.concatenate([out for out, *_ in calls])
    assert judged.size == 8  # prompts_per_step x n, each sample judged once
    # the metric sums in float64 (`PartTotals`), the test in float32
    judge_mean = last["reward/judge:builtin/mean"]
    assert abs(judge_mean - judged.mean()) <= _mean_tolerance(judged, np.ones(judged.size))
    for count in ("retries", "unparsed", "too_long"):
        assert last[f"reward/judge:builtin/{count}"] == sum(c[count] for _, c, *_ in calls)
    # Both paths scored: each score is its last verdict's parse, else `unparsed_score`; the
    # four ratings parsed (7/10 on scale 10: 0.7) and lift the mean above `unparsed_score`.
    for out, _, verdicts, cfg in calls:
        parsed = [parse_verdict(v, cfg) for v in verdicts]
        want = [cfg.unparsed_score if p is None else p for p in parsed]
        np.testing.assert_array_equal(out, np.asarray(want, np.float32))
    assert asked.count("Score: 7/10") == 4 and np.sum(judged == np.float32(0.7)) >= 4
    assert last["reward/judge:builtin/unparsed"] < judged.size
    assert judge_mean > 0.25
    # critic/score/mean: float32's mean of t_i = float32(d_i) + 0.5 j_i (d the digit fraction,
    # in [0, 1], j the judge's score); the parts' means are float64 sums. Roundings: d_i and
    # t_i once each, the sum n - 1 times (sum|t| <= n mean d + 0.5 sum|j|), the divide once.
    n, d, score = judged.size, last["reward/digit_fraction/mean"], last["critic/score/mean"]
    sum_t = n * d + 0.5 * np.abs(judged.astype(np.float64)).sum()
    assert abs(score - (d + 0.5 * judge_mean)) <= FLOAT32_EPS * (d + sum_t + abs(score))

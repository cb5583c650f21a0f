"""Rewards scored while decoding: the streaming scorer equals one whole-batch call, overlaps
decoding (several batches), surfaces errors; the driver reports every finished sample once."""

import threading

import numpy as np
import pytest

from jaxrl_llm.rollout import RolloutDriver, SamplingParams
from jaxrl_llm.rollout.scoring import RewardCounts, StreamingScorer


class _LengthReward:
    """score = len(response) + example["bonus"]; the first batch waits for `release`."""

    def __init__(self):
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.last_failures = {}

    def score(self, responses, examples):
        self.batches.append(list(responses))
        if len(self.batches) == 1:
            assert self.release.wait(10)
        return [len(r) + e["bonus"] for r, e in zip(responses, examples, strict=True)]


def test_streaming_scores_equal_one_batch_in_sample_order():
    reward = _LengthReward()
    texts = ["a", "bbb", "cc", "dddd", ""]
    examples = [{"bonus": 10 * i} for i in range(5)]
    scorer = StreamingScorer(reward, examples)
    scorer.add(3, texts[3])  # the first batch blocks in the reward...
    while not reward.batches:
        threading.Event().wait(0.001)
    for i in (0, 4, 1, 2):  # ...while the others finish and queue up
        scorer.add(i, texts[i])
    reward.release.set()
    scores, counts = scorer.result()
    assert scores == [len(t) + e["bonus"] for t, e in zip(texts, examples, strict=True)]
    assert reward.batches == [["dddd"], ["a", "", "bbb", "cc"]]  # two calls: the overlap
    assert counts == RewardCounts(0, 0, 5, "")


def test_scoring_errors_and_missing_samples_are_raised():
    class Broken:
        def score(self, responses, examples):
            raise RuntimeError("pool is gone")

    scorer = StreamingScorer(Broken(), [{}])
    scorer.add(0, "x")
    with pytest.raises(RuntimeError, match="pool is gone"):
        scorer.result()
    reward = _LengthReward()
    reward.release.set()
    scorer = StreamingScorer(reward, [{"bonus": 0}, {"bonus": 0}])
    scorer.add(1, "x")
    with pytest.raises(ValueError, match="1 samples were never added"):
        scorer.result()


@pytest.mark.slow  # 10 s in a loaded 2-worker run, AMD EPYC AVX2
def test_driver_reports_each_finished_sample_once_as_it_finishes(tiny_engine):
    budgets = [2, 9, 4, 6]
    sps = [SamplingParams(temperature=1.0, max_new_tokens=m, n=2, seed=m) for m in budgets]
    seen: list[tuple[int, object, int]] = []
    driver = RolloutDriver(tiny_engine, steps_per_call=2)
    out = driver.generate(
        [[3, 4, 5], [6, 7], [8, 9, 10, 11], [12]], sps,
        on_finish=lambda i, c: seen.append((i, c, driver.stats["generate_calls"])),
    )  # fmt: skip
    assert sorted(i for i, _, _ in seen) == list(range(8))
    for i, c, _ in seen:
        assert out[i] is c
    calls = {i: n for i, _, n in seen}
    # Short samples are reported before the long ones finish (while decoding goes on).
    assert max(calls[0], calls[1]) < max(calls[2], calls[3])
    assert np.all([len(c.token_ids) <= m for c, m in zip(out, np.repeat(budgets, 2))])

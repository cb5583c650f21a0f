"""Batches sampled ahead survive a checkpoint's JSON exactly: every array, dtype and field."""

import dataclasses
import json

import numpy as np
import pytest

from jaxrl_llm.learner import ahead
from jaxrl_llm.types import Completion, Rollout


def _completion(rng, i, raw):
    n = 5 + i
    return Completion(
        prompt_index=i // 2, sample_index=i % 2,
        prompt_ids=rng.integers(0, 1000, 4).astype(np.int32),
        token_ids=rng.integers(0, 1000, n).astype(np.int32),
        logprobs=rng.normal(-2, 1, n).astype(np.float32),
        raw_logprobs=rng.normal(-2, 1, n).astype(np.float32) if raw else None,
        response_mask=(rng.random(n) < 0.8).astype(np.int32),
        finish_reason="stop", text=f"answer {i} \\u00e9", stop_string="</answer>" if i else None,
        tool_calls=i, error=None if i else "boom", turn_rewards=(0.25, float(i)),
        token_versions=rng.integers(3, 5, n).astype(np.int32) if raw else None,  # partial
    )  # fmt: skip


@pytest.mark.parametrize("raw", [False, True])
def test_a_batch_round_trips_through_json_exactly(raw):
    rng = np.random.default_rng(0)
    rollout = Rollout(
        completions=tuple(_completion(rng, i, raw) for i in range(4)),
        answers=(np.int64(7), "x", {"a": np.float32(0.5)}, [1, 2]),
        prompt_ids=("p0", 17),
        scores=rng.normal(size=4).astype(np.float32),
        group_size=2,
        policy_version=3,
    )
    metrics = {"timing/rollout": 1.25, "reward/errors": 0.0}
    step, (back, back_metrics) = ahead.decode(
        json.loads(json.dumps(ahead.encode(5, (rollout, metrics))))
    )
    assert step == 5 and back_metrics == metrics
    assert back.group_size == 2 and back.policy_version == 3 and back.prompt_ids == ("p0", 17)
    assert back.answers == (7, "x", {"a": 0.5}, [1, 2])
    assert back.scores.dtype == np.float32 and np.array_equal(back.scores, rollout.scores)
    for a, b in zip(rollout.completions, back.completions, strict=True):
        for f in dataclasses.fields(Completion):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y), f.name
            else:
                assert x == y, f.name


def test_a_malformed_saved_batch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"saved batch is malformed.*KeyError"):
        ahead.decode({"step": 1, "completions": []})

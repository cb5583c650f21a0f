"""Stage records: a `Rollout` checks its shapes, selects and concatenates whole groups."""

import dataclasses

import numpy as np
import pytest

from jaxrl_llm.types import Rollout


@dataclasses.dataclass(frozen=True)
class _Sample:  # the fields of rollout.driver.Completion that a Rollout reads
    prompt_ids: tuple
    token_ids: tuple


def _rollout(prompts, G=2, version=3):
    B = len(prompts) * G
    return Rollout(
        completions=tuple(_Sample((p,), tuple(range(j + 1))) for p in prompts for j in range(G)),
        answers=tuple(f"a{p}" for p in prompts for _ in range(G)),
        prompt_ids=tuple(prompts),
        scores=np.arange(B, dtype=np.float32),
        group_size=G,
        policy_version=version,
    )


def test_select_and_concat_keep_whole_groups_in_order():
    r = _rollout([10, 11, 12])
    kept = r.select_groups(np.array([True, False, True]))
    assert kept.prompt_ids == (10, 12) and kept.answers == ("a10", "a10", "a12", "a12")
    np.testing.assert_array_equal(kept.scores, [0, 1, 4, 5])
    both = Rollout.concat([kept, _rollout([20])], prompts=2)
    assert both.prompt_ids == (10, 12) and len(both.completions) == 4
    assert both.policy_version == 3 and both.group_size == 2
    assert r.num_tokens == 3 * (1 + 1) + 3 * (1 + 2)  # prompt token + 1 or 2 response tokens


def test_mismatched_shapes_are_refused():
    r = _rollout([10, 11])
    with pytest.raises(ValueError, match="4 samples, 2 prompts x G=3"):
        dataclasses.replace(r, group_size=3)
    with pytest.raises(ValueError, match="scores"):
        dataclasses.replace(r, scores=np.zeros(3, np.float32))

"""`RolloutStage.env_metrics`: the finish-reason shares of a step's samples."""

from types import SimpleNamespace

import pytest

from jaxrl_llm.rollout.stage import RolloutStage
from jaxrl_llm.types import FINISH_REASONS


def _env_metrics(reasons):
    comps = [SimpleNamespace(text="", tool_calls=0, finish_reason=r) for r in reasons]
    stage = SimpleNamespace(tool=None)
    return RolloutStage.env_metrics(stage, SimpleNamespace(completions=comps))  # pyright: ignore[reportArgumentType]


def test_every_finish_reason_is_logged_each_step_zero_included():
    # A reason no sample ended with is a share of 0, not a missing key: a step without
    # truncation must log rollout/finish/length = 0, or its mean over steps reads high.
    m = _env_metrics(["eos", "eos", "eos", "length"])
    assert m == {f"rollout/finish/{r}": 0.0 for r in FINISH_REASONS} | {
        "rollout/finish/eos": 0.75,
        "rollout/finish/length": 0.25,
    }
    assert sum(m.values()) == pytest.approx(1.0)

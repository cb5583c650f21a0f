"""Failures inside episodes stay inside their sample: a `step` that raises (also on the
final step that scores it), a parser fed JSON Python cannot read, and a factory that fails
partway through a row, whose environments built so far are closed."""

import logging
from typing import cast

import pytest

from jaxrl_llm.agents import EpisodeConfig, Episodes, StepResult
from jaxrl_llm.agents.arithmetic import ArithmeticEnv
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rollout import Engine, RolloutDriver, SamplingParams
from jaxrl_llm.testing import ScriptedEngine

CALL = '<tool_call>{"name": "f", "arguments": {"x": 0}}</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


def _episodes(tokenizer, factory, rows, turns, *, n=1):
    """(completions, scores) of `rows` through the driver, every environment closed."""
    episodes = Episodes(factory, rows, n, tokenizer, EpisodeConfig())
    engine = cast(Engine, ScriptedEngine(tokenizer, turns, batch=4))
    driver = RolloutDriver(engine, tokenizer, max_tool_turns=2)
    try:
        out = driver.generate(
            episodes.prompts, SamplingParams(max_new_tokens=3000, n=n), tool=episodes
        )
        return out, [episodes.finish(i, c) for i, c in enumerate(out)]
    finally:
        episodes.close()


class _FailsOnCalls:
    """Row "a"'s environment raises on every turn with a call, the final one included."""

    tools = ()

    def reset(self, row):
        self.row = row["id"]
        return [{"role": "user", "content": "question"}]

    def step(self, turn):
        if turn.calls and self.row == "a":
            raise ZeroDivisionError("integer division or modulo by zero")
        if turn.calls:
            return StepResult(observations=[{"role": "tool", "name": "f", "content": "1"}])
        return StepResult(reward=1.0, done=True)

    def close(self):
        pass


def test_a_step_that_raises_ends_only_its_sample(tokenizer, caplog):
    """Row "a"'s step raises, then its final step raises again: the sample ends with the
    error and scores what it earned before (nothing: 0); row "b" goes on and scores 1."""
    rows = [{"id": "a"}, {"id": "b"}]
    with caplog.at_level(logging.WARNING):
        out, scores = _episodes(tokenizer, _FailsOnCalls, rows, [CALL, "ok<|im_end|>"])
    assert "tool error" in (out[0].error or "") and out[1].error is None
    assert scores == [0.0, 1.0]
    assert any("final step" in r.getMessage() for r in caplog.records)


def test_unreadable_json_in_the_arithmetic_env_is_a_malformed_call(tokenizer):
    """Nesting deeper than Python's recursion limit is answered as a malformed call."""
    deep = "<tool_call>" + "[" * 1100 + "</tool_call><|im_end|>"
    rows = [{"id": "a", "prompt": "1+1?", "answer": "2"}]
    out, scores = _episodes(tokenizer, ArithmeticEnv, rows, [deep, "\\boxed{2}<|im_end|>"], n=2)
    assert [c.error for c in out] == [None, None] and [c.tool_calls for c in out] == [1, 1]
    assert "malformed tool call" in out[0].text and scores == [1.0, 1.0]


def test_a_factory_that_fails_mid_row_closes_what_it_built(tokenizer):
    built, closed = [], []

    class Env:
        tools = ()

        def __init__(self):
            built.append(self)

        def reset(self, row):
            return [{"role": "user", "content": "q"}]

        def close(self):
            closed.append(self)

    def factory():
        if len(built) == 3:
            raise RuntimeError("out of containers")
        return Env()

    with pytest.raises(RuntimeError, match="out of containers"):
        Episodes(factory, [{"id": "a"}], 4, tokenizer, EpisodeConfig())  # pyright: ignore[reportArgumentType]
    assert len(built) == 3 and closed == built

"""A rollout tool run as an environment (`agents.ToolEnv`, how `RolloutConfig.tool` runs)
gives exactly what the tool alone gives through the sampler: the same prompts, tokens,
masks, logprobs, finish reasons, tool-call counts and texts, and the same calls to the tool.

The reference is the driver with the bare tool (`generate(..., tool=tool)`, the path every
ToRL and Search-R1 test before the port used): scripted turns for ToRL (a call, an error, the
turn limit, a stop without code) and Search-R1 (a search, an invalid action, an answer), and
the shipped model sampling at temperature 1 with the Python tool on the built-in task. The
vLLM backend's equality is in `tests/rollout/test_vllm_backend.py`.
"""

import dataclasses

import numpy as np
import pytest

from jaxrl_llm.agents import EpisodeConfig, Episodes, StepResult, Turn
from jaxrl_llm.agents.episodes import summarise
from jaxrl_llm.agents.tool_env import ToolEnv, tool_env_factory
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.data.templates import search_r1_prompt
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rollout import RolloutDriver, SamplingParams
from jaxrl_llm.testing import ScriptedEngine, assert_as_accurate
from jaxrl_llm.tools import PythonTool
from tests.rollout.reference import exact_logprobs


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


class _Recorded:
    """A tool that records the texts it is asked about (same contract as the tool)."""

    def __init__(self, tool):
        self.tool, self.calls = tool, []
        self.name, self.stop_strings = tool.name, tool.stop_strings

    def __call__(self, text):
        self.calls.append(text)
        return self.tool(text)


def _ids(tokenizer, text):
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)


def _both(make_driver, prompts, sampling, tool, tokenizer):
    """(bare tool's completions and calls, ToolEnv episodes' completions, calls, episodes)."""
    bare = _Recorded(tool)
    with_stops = dataclasses.replace(sampling, stop=(*sampling.stop, *tool.stop_strings))
    plain = make_driver().generate(prompts, with_stops, tool=bare)
    wrapped = _Recorded(tool)
    rows = [{"id": f"r{i}"} for i in range(len(prompts))]
    episodes = Episodes(
        tool_env_factory(wrapped), rows, sampling.n, tokenizer, EpisodeConfig(), prompts=prompts
    )
    sp = dataclasses.replace(sampling, stop=(*sampling.stop, *episodes.stop_strings))
    try:
        env = make_driver().generate(episodes.prompts, sp, tool=episodes)
        rewards = [episodes.finish(i, c) for i, c in enumerate(env)]
    finally:
        episodes.close()
    assert rewards == [0.0] * len(env)  # scored by the run's reward, not the environment
    return (plain, bare.calls), (env, wrapped.calls), episodes


def _assert_same(plain, env, *, logprobs=True):
    """Equal samples; `logprobs=False` leaves the model tokens' logprobs to the caller."""
    assert len(plain) == len(env)
    for x, y in zip(plain, env, strict=True):
        np.testing.assert_array_equal(x.prompt_ids, y.prompt_ids)
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.response_mask, y.response_mask)
        model = x.response_mask.astype(bool) if not logprobs else np.ones(len(x.logprobs), bool)
        np.testing.assert_array_equal(x.logprobs[~model], y.logprobs[~model])
        if logprobs:
            np.testing.assert_array_equal(x.logprobs, y.logprobs)
        assert (x.text, x.finish_reason, x.stop_string, x.tool_calls, x.error) == (
            y.text, y.finish_reason, y.stop_string, y.tool_calls, y.error
        )  # fmt: skip


TORL = {
    "a call then an answer": (
        ["Let me compute.\n```python\nprint(6 * 7)\n```\n```output", "So \\boxed{42}."], 4
    ),
    "the turn limit": (
        ["```python\nprint(1)\n```\n```output", "\n```python\nprint(1 / 0)\n```\n```output",
         "\n```python\nprint(3)\n```\n```output", "\n\\boxed{3}."], 2,
    ),
    "a stop without code": (["No code here.\n```output", "never reached"], 4),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TORL))
def test_torl_turns_are_the_bare_tools(tokenizer, case):
    turns, limit = TORL[case]
    make = lambda: RolloutDriver(
        ScriptedEngine(tokenizer, turns), tokenizer, steps_per_call=8, max_tool_turns=limit
    )
    tool = PythonTool()
    sampling = SamplingParams(max_new_tokens=1024, stop=(), n=2)
    prompts = [_ids(tokenizer, "6 * 7?"), _ids(tokenizer, "Go")]
    (plain, calls), (env, env_calls), episodes = _both(make, prompts, sampling, tool, tokenizer)
    _assert_same(plain, env)
    assert sorted(calls) == sorted(env_calls) and calls
    m = summarise(episodes.metrics())
    assert m["env/calls/mean"] == np.mean([c.tool_calls for c in env])
    assert "env/reward/mean" not in m  # the run's reward scores these episodes


def test_search_r1_turns_are_the_bare_tools(tokenizer, search_task):
    tool, rows = search_task
    turns = [
        f"<think>Unsure.</think>\n<search> {rows[0]['question']} </search>",
        "no opening tag</search>",
        f"<answer> {rows[0]['answer']} </answer>",
    ]
    make = lambda: RolloutDriver(
        ScriptedEngine(tokenizer, turns), tokenizer, steps_per_call=8, max_tool_turns=3
    )
    prompts = [_ids(tokenizer, search_r1_prompt(r["question"])) for r in rows[:2]]
    sampling = SamplingParams(max_new_tokens=1024, stop=(), n=2)
    (plain, calls), (env, env_calls), _ = _both(make, prompts, sampling, tool, tokenizer)
    _assert_same(plain, env)
    assert sorted(calls) == sorted(env_calls)
    assert all(c.tool_calls == 2 and c.finish_reason == "stop" for c in env)


@pytest.mark.slow  # 20 s alone: the shipped model's engine compiles
def test_the_shipped_model_sampling_with_its_python_tool_is_the_bare_tools(tokenizer, tmp_path):
    """Temperature 1, 2 samples a prompt, the built-in task's prompts: whatever the model
    writes (code that runs, fails, or none), both paths give the same samples."""
    from jaxrl_llm.data.config import DataConfig
    from jaxrl_llm.data.prompts import prompt_data
    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.rollout import Engine

    policy = from_pretrained(builtin_checkpoint())
    engine = Engine(policy, max_concurrent_decodes=8, max_cache_length=256, tokenizer=tokenizer)
    data = prompt_data(DataConfig(val_size=8, builtin_train_size=8), tokenizer, tmp_path)
    assert data.val is not None
    batch = next(iter(data.val.iterator()))
    prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in range(len(batch))]
    make = lambda: RolloutDriver(engine, tokenizer, max_tool_turns=2)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=128, n=2, seed=3)
    (plain, calls), (env, env_calls), _ = _both(make, prompts, sampling, PythonTool(), tokenizer)
    _assert_same(plain, env, logprobs=False)
    assert sorted(calls) == sorted(env_calls)
    assert any(c.tool_calls for c in env)  # the comparison covers tool turns
    # The model tokens' logprobs: the engine's float32 values move in their last bits with
    # the decode schedule (slots, the call a sample resumes in), which the tool calls' timing
    # decides on either path (two runs of the bare tool differ alike; without a tool they
    # repeat exactly), so they are measured against the exact values.
    mine = lambda cs: np.concatenate([c.response_mask for c in cs]).astype(bool)
    lp = lambda cs: np.concatenate([c.logprobs for c in cs])[mine(cs)]
    assert_as_accurate(lp(env), lp(plain), exact_logprobs(policy, plain)[mine(plain)])


class _Schemas(ToolEnv):
    tools = ({"type": "function", "function": {"name": "f", "parameters": {}}},)


def test_an_environment_without_messages_needs_pipeline_prompts_and_no_schemas(tokenizer):
    rows, tool = [{"id": "r0"}], PythonTool()
    with pytest.raises(ValueError, match="no pipeline prompts were given"):
        Episodes(tool_env_factory(tool), rows, 1, tokenizer, EpisodeConfig())
    with pytest.raises(ValueError, match="it has tool schemas"):
        Episodes(lambda: _Schemas(tool), rows, 1, tokenizer, EpisodeConfig(), prompts=[[1]])
    with pytest.raises(ValueError, match="reward_placement = 'turns'"):
        cfg = EpisodeConfig(reward_rule="sum", reward_placement="turns")
        Episodes(tool_env_factory(tool), rows, 1, tokenizer, cfg, prompts=[[1]])


def test_a_tool_env_answers_the_final_step_without_asking_the_tool():
    tool = _Recorded(PythonTool())
    env = ToolEnv(tool)
    final = Turn("```python\nprint(1)\n```\n```output", final=True)
    assert env.step(final) == StepResult(done=True)
    assert tool.calls == [] and env.reset({"id": "r"}) == []
    assert env.step(Turn("no call")) == StepResult(done=True)  # the tool's None
    answered = env.step(dataclasses.replace(final, final=False))
    assert answered.observations == "\n1\n```\n"
    metrics = dict(answered.metrics)
    assert metrics.pop("tools/python/latency_s") > 0
    assert metrics == {"tools/python/calls": 1.0, "tools/python/ran": 1.0}

"""Worked episodes as SFT text: `encode_episode` gives the token ids and mask that the same
conversation has when `Episodes` runs it through the real `RolloutDriver` (scripted policy
writing the demonstration's turns), and the built-in arithmetic demonstrations are right."""

import json

import numpy as np
import pytest

from jaxrl_llm.agents import EpisodeConfig, Episodes
from jaxrl_llm.agents.arithmetic import ArithmeticEnv, demonstration
from jaxrl_llm.agents.demonstrations import encode_episode
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.data.tasks import arithmetic
from jaxrl_llm.learner.sft import encode_example
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rollout import RolloutDriver, SamplingParams
from jaxrl_llm.testing import ScriptedEngine

PROBLEMS = arithmetic.generate_problems(40, seed=0, id_prefix="t", split="train")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_sft_encoding_is_the_rl_episode(tokenizer, level):
    problem = next(p for p in PROBLEMS if p["level"] == level)
    messages = demonstration(problem)
    tools = ArithmeticEnv().tools
    ids, mask = encode_episode(messages, tools, tokenizer)
    assert encode_example({"messages": messages, "tools": tools}, tokenizer) == (ids, mask)

    turns = [m["content"] + tokenizer.eos_token for m in messages if m["role"] == "assistant"]
    episodes = Episodes(ArithmeticEnv, [problem], 1, tokenizer, EpisodeConfig())
    driver = RolloutDriver(ScriptedEngine(tokenizer, turns), tokenizer, max_tool_turns=4)
    (c,) = driver.generate(episodes.prompts, SamplingParams(max_new_tokens=1024), tool=episodes)
    reward = episodes.finish(0, c)
    episodes.close()
    prompt = episodes.prompts[0].tolist()
    assert ids == prompt + c.token_ids.tolist()
    np.testing.assert_array_equal(mask, [0] * len(prompt) + c.response_mask.tolist())
    assert reward == 1.0  # the demonstration is right, as the environment scores it
    assert c.tool_calls == (2 if level == 4 else 1)


def test_demonstrations_call_one_tool_per_operation():
    level4 = next(p for p in PROBLEMS if p["level"] == 4)
    calls = [json.loads(m["content"][11:-12]) for m in demonstration(level4)[1:-1:2]]
    assert [c["name"] for c in calls] == ["multiply", "subtract"]
    assert calls[1]["arguments"]["a"] == calls[0]["arguments"]["a"] * calls[0]["arguments"]["b"]


def test_malformed_episodes_are_refused(tokenizer):
    with pytest.raises(ValueError, match="at least one assistant turn"):
        encode_episode([{"role": "user", "content": "x"}], None, tokenizer)
    with pytest.raises(ValueError, match="ends with the model's last turn"):
        encode_episode(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
             {"role": "tool", "content": "z"}], None, tokenizer,
        )  # fmt: skip

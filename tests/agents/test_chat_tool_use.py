"""Chat-format tool calling through the real `RolloutDriver` (scripted policy): a turn ends on
the end-of-turn token, its calls (several, malformed ones too) are answered with the
template's own rendering of `tool` messages, appended token-exact and masked; a turn without
a call ends the sample as "eos". Loaded as a plug-in by import path with the tokenizer."""

from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.agents import ChatToolUse, ToolBox
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rollout import RolloutDriver, SamplingParams
from jaxrl_llm.testing import ScriptedEngine
from jaxrl_llm.tools import build_tool

from .tools_example import add, to_km

HERE = Path(__file__).parent
CALLS = (
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "to_km", "arguments": {"value": 1, "unit": "mile"}}\n</tool_call>'
)
# A Qwen2.5-style template (Hermes tool calls): consecutive `tool` messages are one user turn
# of <tool_response> blocks, as Qwen2.5-Instruct's own template renders them.
QWEN_STYLE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


def _ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_the_observation_is_the_templates_own_rendering(tokenizer, monkeypatch):
    tool = ChatToolUse(ToolBox([add, to_km]), tokenizer)
    assert tool.chat.generation_prompt == "<|im_start|>assistant\n"
    obs = tool(f"Let me add.{CALLS}<|im_end|>")
    assert obs == (  # the shipped checkpoint's template: one turn per message
        "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>tool\n1.609344<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    monkeypatch.setattr(tokenizer, "chat_template", QWEN_STYLE)
    qwen = ChatToolUse(ToolBox([add, to_km]), tokenizer)
    assert qwen(f"{CALLS}<|im_end|>") == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n"
        "1.609344\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert qwen("The answer is 6.<|im_end|>") is None  # no call: the final answer
    # Only the last turn counts: an earlier turn's calls were answered already.
    assert qwen(f"{CALLS}<|im_end|>{qwen(CALLS + '<|im_end|>')}Done.<|im_end|>") is None


def test_an_episode_through_the_driver_is_token_exact_and_masked(tokenizer, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # as PYTHONPATH=. does for a user's module
    tool = build_tool("tools_example:make_tools", tokenizer=tokenizer)
    assert isinstance(tool, ChatToolUse) and tool.stop_strings == ()
    turns = [
        f"Both.{CALLS}<|im_end|>",
        '<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call><tool_call>{bad'
        "</tool_call><|im_end|>",
        "It is 5 and 1.609344 km.<|im_end|>",
    ]
    engine = ScriptedEngine(tokenizer, turns, filler="~")
    driver = RolloutDriver(engine, tokenizer, steps_per_call=8, max_tool_turns=4)
    (c,) = driver.generate(["Add 2 and 3."], SamplingParams(max_new_tokens=2048), tool=tool)
    obs = [tool.chat.observation(m, "<|im_end|>") for m in (
        [{"role": "tool", "name": "add", "content": "5"},
         {"role": "tool", "name": "to_km", "content": "1.609344"}],
        [{"role": "tool", "name": "add", "content":
          "Error: bad arguments for add: 'b' is a required property; a: 'x' is not of type "
              "'number'"},
         {"role": "tool", "name": "error", "content":
          "Error: malformed tool call (not JSON: Expecting property name enclosed in double "
          "quotes); write a JSON object with a name and arguments"}],
    )]  # fmt: skip
    want = [
        (_ids(tokenizer, turns[0]), 1), (_ids(tokenizer, obs[0]), 0),
        (_ids(tokenizer, turns[1]), 1), (_ids(tokenizer, obs[1]), 0),
        (_ids(tokenizer, turns[2]), 1),
    ]  # fmt: skip
    assert c.token_ids.tolist() == [t for ids, _ in want for t in ids]
    np.testing.assert_array_equal(c.response_mask, [m for ids, m in want for _ in ids])
    assert (c.finish_reason, c.tool_calls, c.error) == ("eos", 2, None)
    m = tool.metrics()
    assert (m["tools/add/calls"], m["tools/add/errors"], m["tools/malformed"]) == (2, 1, 1)
    assert m["tools/to_km/calls"] == 1


def test_the_turn_limit_ends_an_episode_as_eos(tokenizer):
    tool = ChatToolUse(ToolBox([add, to_km]), tokenizer)
    engine = ScriptedEngine(tokenizer, [f"{CALLS}<|im_end|>"] * 3, filler="~")
    driver = RolloutDriver(engine, tokenizer, steps_per_call=8, max_tool_turns=1)
    (c,) = driver.generate(["Go."], SamplingParams(max_new_tokens=512), tool=tool)
    assert (c.finish_reason, c.tool_calls) == ("eos", 1)
    assert c.token_ids.tolist()[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")

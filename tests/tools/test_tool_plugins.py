"""Tool plug-ins by import path: the docs' example tool built from its config name and run
through the real `RolloutDriver` (scripted policy); contract errors at start-up."""

import re
from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rollout import RolloutDriver, SamplingParams
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.testing import ScriptedEngine
from jaxrl_llm.tools import Tool, build_tool

HERE = Path(__file__).parent
DOC = HERE.parents[1] / "docs" / "agents.md"
TURNS = ["Let me compute. <calc>6 * 7</calc>", " So the answer is \\boxed{42}."]


@pytest.fixture
def on_path(monkeypatch):
    """The example module importable as `example_tool`, as `PYTHONPATH=.` does for a user."""
    monkeypatch.syspath_prepend(str(HERE))


def test_the_docs_show_the_example_module_verbatim():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert (HERE / "example_tool.py").read_text() in blocks


def test_example_tool_by_path_runs_in_a_rollout(on_path):
    tool = build_tool(RolloutConfig(tool="example_tool:make_calculator").tool)
    assert isinstance(tool, Tool) and tool.stop_strings == ("</calc>",)
    assert tool("x <calc>2 ** 10 / 4</calc>") == "\n<result>256</result>\n"
    assert tool("<calc>1/0</calc>") == "\n<result>error: division by zero</result>\n"
    assert "only numbers" in tool("<calc>__import__('os')</calc>")
    assert tool("no call here") is None

    tokenizer = load_tokenizer(builtin_checkpoint())
    engine = ScriptedEngine(tokenizer, TURNS, filler="~")
    driver = RolloutDriver(engine, tokenizer, steps_per_call=8, max_tool_turns=2)
    sampling = SamplingParams(max_new_tokens=512, stop=tool.stop_strings, n=2)
    out = driver.generate(["What is 6 * 7?"], sampling, tool=tool)
    observation = "\n<result>42</result>\n"
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    for completion in out:
        assert completion.text == TURNS[0] + observation + TURNS[1]
        assert completion.tool_calls == 1 and completion.finish_reason == "eos"
        mask = [1] * len(ids(TURNS[0])) + [0] * len(ids(observation)) + [1] * len(ids(TURNS[1]))
        np.testing.assert_array_equal(completion.response_mask[: len(mask)], mask)


def test_wrong_tools_fail_at_start_with_what_is_expected(on_path, monkeypatch):
    import example_tool

    with pytest.raises(ValueError, match=r"rollout.tool = 'calculator': expected one of"):
        RolloutConfig(tool="calculator")
    with pytest.raises(ImportError, match=r"rollout.tool = 'example_tool:nope'.*PYTHONPATH"):
        build_tool("example_tool:nope")
    with pytest.raises(TypeError, match=r"'example_tool:OPS' is a dict, not a function"):
        build_tool("example_tool:OPS")
    with pytest.raises(TypeError, match=r"without the tool contract.*'name', 'stop_strings'"):
        build_tool("builtins:object")
    no_stops = lambda: example_tool.Calculator(stop_strings=())
    monkeypatch.setattr(example_tool, "no_stops", no_stops, raising=False)
    with pytest.raises(TypeError, match=r"stop_strings must be a non-empty tuple"):
        build_tool("example_tool:no_stops")
    assert build_tool("none") is None

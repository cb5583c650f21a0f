"""Scripted policy through the real `RolloutDriver`: ToRL and Search-R1 tool turns.

`jaxrl_llm.testing.ScriptedEngine` stands in for the model: every sample emits a fixed
script, one text per model turn, filler after each turn until the driver's stop-string cut,
EOS after the last. The tools are real: `PythonTool` (bubblewrap sandbox) and the BM25
`SearchTool`, called with the driver's one contract (text ending in the stop string).
"""

import numpy as np
import pytest

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.data.templates import search_r1_prompt
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rewards import exact_match_reward, format_reward
from jaxrl_llm.rollout import RolloutDriver, SamplingParams
from jaxrl_llm.testing import ScriptedEngine
from jaxrl_llm.tools import PythonTool
from jaxrl_llm.tools.python_tool import OUTPUT_START
from jaxrl_llm.tools.search import INVALID_ACTION, information_block

FILLER = "~"
LOGPROB = -0.25


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(builtin_checkpoint())


@pytest.fixture(scope="module")
def python_tool():
    return PythonTool()


def run_script(tokenizer, turns, prompt, tool, stop, *, n=2, max_tool_turns=4):
    engine = ScriptedEngine(tokenizer, turns, filler=FILLER, logprob=LOGPROB)
    calls = []

    def counted(text):
        calls.append(text)
        return tool(text)

    driver = RolloutDriver(engine, tokenizer, steps_per_call=8, max_tool_turns=max_tool_turns)
    sampling = SamplingParams(max_new_tokens=1024, stop=stop, n=n)
    return driver.generate([prompt], sampling, tool=counted), engine, calls


def check_turns(tokenizer, completion, model_texts, observations):
    """The completion is model text, observation, model text, ...: model tokens have mask 1
    and their logprob, observation tokens mask 0 and logprob 0."""
    ids = lambda t: tokenizer(t, add_special_tokens=False)["input_ids"]
    expected_ids, expected_mask = [], []
    for i, text in enumerate(model_texts):
        expected_ids += ids(text)
        expected_mask += [1] * len(ids(text))
        if i < len(observations):
            expected_ids += ids(observations[i])
            expected_mask += [0] * len(ids(observations[i]))
    n = len(expected_ids)
    np.testing.assert_array_equal(completion.token_ids[:n], expected_ids)
    np.testing.assert_array_equal(completion.response_mask[:n], expected_mask)
    mask = completion.response_mask.astype(bool)
    np.testing.assert_array_equal(completion.logprobs[~mask], 0.0)
    np.testing.assert_array_equal(completion.logprobs[mask], LOGPROB)
    assert FILLER not in completion.text  # the driver cut each turn at its stop string


TORL_TURNS = [
    "Let me compute it in Python.\n```python\nprint(6 * 7)\n```\n```output",
    "The answer is \\boxed{42}.",
]


def test_torl_output_block_is_inserted_masked_and_generation_continues(tokenizer, python_tool):
    stop = python_tool.stop_strings
    out, engine, calls = run_script(tokenizer, TORL_TURNS, "6 * 7?", python_tool, stop)
    obs = "\n42\n```\n"
    assert len(out) == 2 and len(calls) == 2  # one tool call per sample
    assert all(text == TORL_TURNS[0] for text in calls)  # the stop string ends the text
    for c in out:
        assert c.text == TORL_TURNS[0] + obs + TORL_TURNS[1]
        assert c.finish_reason == "eos" and c.tool_calls == 1
        check_turns(tokenizer, c, TORL_TURNS, [obs])
        assert c.response_mask[-1] == 1  # EOS is the model's
    # The observation went into the sample's cache row right after the model's "```output".
    obs_ids = tokenizer(obs, add_special_tokens=False)["input_ids"]
    turn0 = len(tokenizer(TORL_TURNS[0], add_special_tokens=False)["input_ids"])
    for slot, tokens, start in engine.appended:
        assert tokens == obs_ids and start == engine.prompt_lengths[slot] + turn0


def test_torl_max_tool_turns_caps_the_calls(tokenizer, python_tool):
    turns = [
        "```python\nprint(1)\n```\n```output",
        "\n```python\nprint(1 / 0)\n```\n```output",
        "\n```python\nprint(3)\n```\n```output",
        "\nThe answer is \\boxed{3}.",
    ]
    tool = python_tool
    out, _, calls = run_script(
        tokenizer, turns, "Go", tool, tool.stop_strings, n=1, max_tool_turns=2
    )
    (c,) = out
    observations = ["\n1\n```\n", "\nZeroDivisionError: division by zero\n```\n"]
    assert len(calls) == 2 and c.tool_calls == 2
    # The third "```output" ends the sample: no third call, nothing after it.
    assert c.finish_reason == "stop" and c.stop_string == OUTPUT_START
    assert c.text == turns[0] + observations[0] + turns[1] + observations[1] + turns[2]
    check_turns(tokenizer, c, turns[:3], observations)


def test_torl_stop_without_code_ends_the_sample(tokenizer, python_tool):
    turns = ["No code here.\n```output", "never reached"]
    tool = python_tool
    (c,), _, calls = run_script(tokenizer, turns, "Go", tool, tool.stop_strings, n=1)
    assert len(calls) == 1 and c.tool_calls == 0
    assert c.finish_reason == "stop" and c.text == turns[0]
    np.testing.assert_array_equal(c.response_mask, 1)


def test_search_r1_information_is_masked_and_answer_scores_em(search_task, tokenizer):
    tool, rows = search_task
    row = rows[0]
    turns = [
        f"<think>I do not know this.</think>\n<search> {row['question']} </search>",
        f"<think>The document says it.</think>\n<answer> {row['answer']} </answer>",
    ]
    prompt = search_r1_prompt(row["question"])
    out, _, calls = run_script(tokenizer, turns, prompt, tool, tool.stop_strings)
    docs = tool.retriever.search(row["question"], 2)
    assert docs[0].id == row["doc_id"]  # the fact's own document ranks first
    info = information_block(docs)
    assert len(calls) == 4  # per sample: one search, then the "</answer>" stop (-> None)
    for c in out:
        assert c.text == turns[0] + info + turns[1]
        # The tool declined the "</answer>" stop, which ends the sample.
        assert c.finish_reason == "stop" and c.tool_calls == 1
        check_turns(tokenizer, c, turns, [info])
        assert exact_match_reward(c.text, row["answer"]) == 1.0
        assert exact_match_reward(c.text, rows[1]["answer"]) == 0.0
        assert format_reward(c.text, style="search_r1") == 1.0


def test_search_r1_max_turns_and_invalid_action(search_task, tokenizer):
    tool, rows = search_task
    turns = [
        f"<search> {rows[0]['question']} </search>",
        "no opening tag</search>",
        f"<search> {rows[1]['question']} </search>",
        "<answer> x </answer>",
    ]
    out, _, calls = run_script(
        tokenizer, turns, "Q?", tool, tool.stop_strings, n=1, max_tool_turns=2
    )
    (c,) = out
    observations = [
        information_block(tool.retriever.search(rows[0]["question"], 2)),
        INVALID_ACTION,
    ]
    assert len(calls) == 2 and c.tool_calls == 2
    assert c.finish_reason == "stop" and c.stop_string == "</search>"
    assert c.text == turns[0] + observations[0] + turns[1] + observations[1] + turns[2]
    check_turns(tokenizer, c, turns[:3], observations)

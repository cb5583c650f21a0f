"""Tool hand-over at a stop string, on the JAX driver and the vLLM sampler's host logic:
the text handed to a tool ends in the stop string even when the token that completes it
carries more text, and a stop string of the run's own (`RolloutConfig.stop`) ends the
sample instead of going to the tool or environment."""

import concurrent.futures as cf
import functools
import json
from typing import Any, cast

import numpy as np
import pytest

from jaxrl_llm.agents import EpisodeConfig, Episodes
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import load_tokenizer
from jaxrl_llm.rollout import Engine, RolloutDriver, SamplingParams
from jaxrl_llm.rollout.completions import LiveSample
from jaxrl_llm.testing import ReplyingEnv, ScriptedEngine
from jaxrl_llm.tools.protocol import hands_over
from jaxrl_llm.tools.search import INVALID_ACTION, make_search_tool


@pytest.fixture
def merged_tokenizer():
    """The shipped tokenizer with ">\\n" as one token, as real BPE vocabularies have it."""
    tok = load_tokenizer(builtin_checkpoint())
    tok.add_tokens([">\n"])
    return tok


@pytest.fixture
def search_tool(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "1", "contents": "Paris\nParis is in France."}) + "\n")
    return make_search_tool(path)


class _Recorder:
    """A tool that records what it is handed, answering its first call only."""

    def __init__(self, tool):
        self.tool, self.seen = tool, []
        self.name, self.stop_strings = tool.name, tool.stop_strings

    def __call__(self, text):
        self.seen.append(text)
        return self.tool(text) if len(self.seen) == 1 else None


def test_a_stop_string_completed_mid_token_ends_the_tools_text(merged_tokenizer, search_tool):
    """ "</search>\\n" is "</search" + ">\\n": the search tool gets text ending "</search>",
    answers it, and the sampled ">\\n" token stays in the response."""
    tok = merged_tokenizer
    turn = "<search> capital of France </search>\n"
    assert tok.decode(tok(turn, add_special_tokens=False)["input_ids"][-1:]) == ">\n"
    tool = _Recorder(search_tool)
    engine = cast(Engine, ScriptedEngine(tok, [turn, "done<|im_end|>"]))
    sp = SamplingParams(max_new_tokens=200, stop=search_tool.stop_strings)
    (c,) = RolloutDriver(engine, tok, max_tool_turns=2).generate([[1, 2, 3]], sp, tool=tool)
    assert tool.seen[0] == turn[:-1]
    assert c.tool_calls == 1 and "<information>" in c.text and INVALID_ACTION not in c.text
    first = tok(turn, add_special_tokens=False)["input_ids"]
    assert c.token_ids[: len(first)].tolist() == first and c.response_mask[: len(first)].all()


@pytest.mark.parametrize(
    ("text", "turn", "stop", "want"),
    [
        ("a <s>q</s>\n", "<s>q</s>\n", "</s>", "a <s>q</s>"),
        ("x\n\n\n", "x\n\n\n", "\n\n", "x\n\n"),  # the first match, not the last
        ("a </s>", "</s>", "</s>", "a </s>"),
        ("a b<|im_end|>", "b<|im_end|>", None, "a b<|im_end|>"),  # an EOS turn
        ("ab", "ab", "<|x|>", "ab"),  # a stop of special tokens the tool does not see
    ],
)
def test_text_for_tool_cuts_right_after_the_turns_first_match(text, turn, stop, want):
    from jaxrl_llm.tools.protocol import text_for_tool

    assert text_for_tool(text, turn, stop) == want


def test_a_run_stop_string_ends_an_episode_on_the_driver():
    """`RolloutConfig.stop` ends the sample ("stop"), not a turn handed to the environment."""
    tok = load_tokenizer(builtin_checkpoint())
    episodes = Episodes(
        functools.partial(ReplyingEnv, [{"role": "user", "content": "use a tool"}]),
        [{"id": "a"}],
        1,
        tok,
        EpisodeConfig(),
    )
    engine = cast(Engine, ScriptedEngine(tok, ["The answer is 3. STOP", "more text<|im_end|>"]))
    driver = RolloutDriver(engine, tok, max_tool_turns=2)
    sp = SamplingParams(max_new_tokens=300, stop=("STOP",))
    (c,) = driver.generate(episodes.prompts, sp, tool=episodes)
    episodes.close()
    assert (c.finish_reason, c.stop_string, c.tool_calls) == ("stop", "STOP", 0)
    assert c.text.endswith("STOP")


def test_hands_over_only_on_the_tools_own_stop_strings():
    class Tool:
        stop_strings = ("</calc>",)

        def __call__(self, text):
            return None

    assert hands_over(Tool(), "stop", "</calc>")
    assert not hands_over(Tool(), "stop", "STOP")
    assert hands_over(lambda text: None, "stop", "STOP")  # no stop strings: every one
    assert not hands_over(Tool(), "eos", None)


class _FakeVllmCall:
    """The part of the vLLM sampler's `_Call` that `_end_turn` reads."""

    def __init__(self, tool):
        self.tool, self.pool, self.pending, self.finished = tool, cf.ThreadPoolExecutor(1), {}, []

    def finish(self, s, completion):
        self.finished.append(completion)


def _vllm_end_turn(tok, tool, text, stop):
    """The vLLM sampler's end of a turn of `text` that stopped on `stop`, without vLLM."""
    from jaxrl_llm.rollout.vllm_sampler import VllmSampler

    sampler = object.__new__(VllmSampler)
    sampler.tokenizer, sampler.max_tool_turns = tok, 2
    call: Any = _FakeVllmCall(tool)
    s = LiveSample(
        0, 0, np.asarray([1], np.int32), SamplingParams(max_new_tokens=50, stop=(stop,)), 0
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    s.sampled(ids, [0.0] * len(ids))
    try:
        sampler._end_turn(call, s, "stop", stop)
        cf.wait(list(call.pending))
    finally:
        call.pool.shutdown()
    return call


def test_the_vllm_sampler_hands_over_as_the_driver_does(merged_tokenizer, search_tool):
    tok = merged_tokenizer
    tool = _Recorder(search_tool)
    call = _vllm_end_turn(tok, tool, "<search> capital </search>\n", "</search>")
    assert tool.seen == ["<search> capital </search>"] and not call.finished
    tool = _Recorder(search_tool)
    call = _vllm_end_turn(tok, tool, "The answer. STOP", "STOP")
    assert tool.seen == [] and [c.finish_reason for c in call.finished] == ["stop"]
    assert call.finished[0].stop_string == "STOP"

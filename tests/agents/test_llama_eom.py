"""Llama 3.1 ends a tool call's turn with `<|eom_id|>` (its template says `Environment:
ipython` when tools are given; `<|eom_id|>` is one of Llama-3.1-Instruct's stop ids). The
control tokens are special added tokens the tokenizer does not name (`all_special_tokens`
lists bos and eos only): the turn still ends there, is one well-formed call, its text holds no
control token, and the observation follows `<|eom_id|>` as Meta's format does."""

import pytest

from jaxrl_llm.agents import ChatToolUse, ToolBox, ToolCall
from jaxrl_llm.agents.arithmetic import add

from .llama_stand_in import llama_tokenizer

CALL = '{"name": "add", "parameters": {"a": 2, "b": 3}}'


@pytest.fixture(scope="module")
def tool():
    return ChatToolUse(ToolBox([add], timeout_s=5), llama_tokenizer(), fmt="llama3_json")


def _sampled(tok, text: str) -> str:
    """`text` as the sampler hands it to a chat tool: encoded, decoded with special tokens."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("end", ["<|eot_id|>", "<|eom_id|>"])
def test_a_call_ending_in_either_stop_token_is_one_clean_call(tool, end):
    text = _sampled(tool.chat.tokenizer, f"<|python_tag|>{CALL}{end}")
    turn, parsed, found_end = tool.chat.parse(text)
    assert (turn, found_end) == (CALL, end)
    assert parsed.calls == (ToolCall("add", {"a": 2, "b": 3}),) and parsed.malformed == ()


def test_unnamed_control_tokens_are_not_the_models_text(tool):
    prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    text = _sampled(tool.chat.tokenizer, f"{prompt}It is<|start_header_id|> 5.<|eot_id|>")
    assert tool.chat.last_turn(text) == ("It is 5.", "<|eot_id|>")


@pytest.mark.parametrize("end", ["<|eot_id|>", "<|eom_id|>"])
def test_the_observation_follows_the_models_end_token(tool, end):
    """After `<|eom_id|>` Meta's format goes straight to the `ipython` header: the
    template's `<|eot_id|>` is left out, as it is after the model's own `<|eot_id|>`."""
    obs = tool(_sampled(tool.chat.tokenizer, f"<|python_tag|>{CALL}{end}"))
    assert str(obs) == (
        "<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert tool.metrics()["tools/malformed"] == 0.0

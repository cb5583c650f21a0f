"""Calls rendered by a template's own `tool_calls` rendering (transformers' `tojson`, which
leaves `<`, `>` and `/` unescaped) parse back equal, whatever their arguments hold: braces,
quotes, unicode, `<tool_call>` or `</tool_call>`, `</think>`. A `</think>` is the end of the
reasoning only where the generation prompt opened a `<think>`; a call that such a `</think>`
cuts is answered as malformed, never dropped silently."""

import pytest

from jaxrl_llm.agents import MalformedCall, ToolCall, parse_turn
from jaxrl_llm.agents.chat import ChatFormat
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import load_tokenizer

from .llama_stand_in import llama_tokenizer

# Qwen2.5-Instruct's rendering of an assistant turn with calls, and of tool answers.
QWEN_CALLS = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{{- '<|im_start|>assistant' }}"
    "{%- if m.content %}{{- '\\n' + m.content }}{%- endif %}"
    "{%- for c in m.tool_calls %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \' }}'
    "{{- c.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3-Thinking-2507 and DeepSeek-R1 open the reasoning in the generation prompt.
PROMPT = "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
THINKING = QWEN_CALLS.replace(PROMPT, PROMPT.replace("\\n'", "\\n<think>\\n'"))

ARGS = [
    {"a": 2, "b": 3},
    {"q": 'nested {braces} and "quotes" and \\ back'},
    {"q": "unicode é 日本 \u2028 emoji 😀"},
    {"obj": {"x": [1, {"y": "}"}]}},
    {"q": "a </tool_call> inside"},
    {"code": "print('<tool_call>')"},
    {"q": "</think> in an argument"},
    {"q": "</tool_call>\n<tool_call>\n{}"},
]


@pytest.fixture(scope="module")
def qwen():
    tok = load_tokenizer(builtin_checkpoint())
    tok.chat_template = QWEN_CALLS
    return tok


@pytest.fixture(scope="module")
def llama():
    return llama_tokenizer()


def _turn(tok, calls: list[dict]) -> str:
    """The assistant turn the template renders for `calls`, to its end-of-turn token, with
    the generation prompt before it: what the sampler hands a chat tool."""
    user = [{"role": "user", "content": "u"}]
    said = [{"type": "function", "function": {"name": "f", "arguments": a}} for a in calls]
    full = tok.apply_chat_template(
        [*user, {"role": "assistant", "content": "", "tool_calls": said}], tokenize=False
    )
    before = tok.apply_chat_template(user, tokenize=False)
    return full[len(before) : full.rindex(tok.eos_token) + len(tok.eos_token)]


@pytest.mark.parametrize("args", ARGS, ids=range(len(ARGS)))
@pytest.mark.parametrize("fmt", ["qwen", "llama3_json"])
def test_a_rendered_call_parses_back_equal(fmt, args, qwen, llama):
    tok = qwen if fmt == "qwen" else llama
    _, parsed, _ = ChatFormat(tok, fmt).parse(_turn(tok, [args]))
    assert (parsed.calls, parsed.malformed) == ((ToolCall("f", args),), ())


def test_several_calls_parse_back_in_order(qwen):
    _, parsed, _ = ChatFormat(qwen, "qwen").parse(_turn(qwen, ARGS))
    assert parsed.calls == tuple(ToolCall("f", a) for a in ARGS) and parsed.malformed == ()


def test_the_closing_tag_must_follow_the_json():
    """The JSON object is read first; where no closing tag follows it (text after the
    object, or no object), the block ends at the first closing tag, as before."""
    turn = parse_turn("qwen", '<tool_call>{"name": "f"} junk</tool_call> ok')
    assert turn.calls == () and turn.content == "ok"
    assert turn.malformed[0].reason.startswith("not JSON: Extra data")
    turn = parse_turn("qwen", '<tool_call>{"name": "f", "arguments": {"q": "</tool_call>')
    assert turn.malformed[0].reason == "not JSON: Unterminated string starting at"


def test_a_think_close_is_the_reasoning_end_only_after_a_thinking_prompt(qwen, monkeypatch):
    draft = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    plain = ChatFormat(qwen, "qwen")
    assert not plain.opens_reasoning
    monkeypatch.setattr(qwen, "chat_template", THINKING)
    thinking = ChatFormat(qwen, "qwen")
    assert thinking.generation_prompt == "<|im_start|>assistant\n<think>\n"
    assert thinking.opens_reasoning
    _, parsed, _ = thinking.parse(f"Plan: {draft}\n</think>\n\n{call}<|im_end|>")
    assert parsed.calls == (ToolCall("f", {"a": 1}),) and parsed.malformed == ()
    assert parsed.reasoning == f"Plan: {draft}"
    _, parsed, _ = plain.parse(f"Plan: {draft}\n</think>\n\n{call}<|im_end|>")
    assert len(parsed.calls) == 2  # no <think> opened: a stray </think> is text


def test_a_call_cut_by_the_reasoning_end_is_malformed_not_lost():
    text = '<tool_call>\n{"name": "f", "arguments": {"q": "a </think> b"}}\n</tool_call>'
    assert parse_turn("qwen", text).calls == (ToolCall("f", {"q": "a </think> b"}),)
    cut = parse_turn("qwen", text, prompt_opens_reasoning=True)
    assert cut.calls == ()
    (bad,) = cut.malformed
    assert isinstance(bad, MalformedCall) and "</think>" in bad.reason
    llama = '{"name": "f", "parameters": {"q": "a </think> b"}}'
    cut = parse_turn("llama3_json", llama, prompt_opens_reasoning=True)
    assert cut.calls == () and len(cut.malformed) == 1
    drafted = parse_turn("qwen", f"I may call {text[:30]}...</think>", prompt_opens_reasoning=True)
    assert len(drafted.malformed) == 1  # an unfinished call the </think> cut


def test_tool_call_tags_that_are_special_tokens_stay_in_the_turn():
    """A tokenizer that makes `<tool_call>` a special token (Hermes 3): `ChatFormat`
    removes the other special tokens from the turn, not the markup the parser reads."""
    tok = load_tokenizer(builtin_checkpoint())
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    tok.chat_template = QWEN_CALLS
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    turn, parsed, end = ChatFormat(tok, "qwen").parse(f"{call}<|im_end|>")
    assert (turn, parsed.calls, end) == (call, (ToolCall("f", {"a": 1}),), "<|im_end|>")

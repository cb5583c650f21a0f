"""SFT inputs: rows read from a jsonl train_file, and the tool-output spans masked from the loss."""

import json

import pytest

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.sft import SFTConfig, encode_example, file_examples
from jaxrl_llm.models import load_tokenizer


def _write_rows(path, rows):
    # ensure_ascii=False writes U+2028, U+2029 and U+0085 raw, as JSON allows inside strings.
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")


def test_line_separators_inside_strings_stay_in_their_row(tmp_path):
    rows = [
        {"prompt": "say hi", "response": "line one\u2028line two"},
        {"prompt": "q", "response": "para\u2029graph, next\x85line"},
        {"prompt": "a", "response": "b"},
    ]
    data = tmp_path / "pairs.jsonl"
    _write_rows(data, rows)
    train, val = file_examples(SFTConfig(train_file=str(data), n_val=1))
    assert val == rows[:1] and train == rows[1:]


def test_blank_lines_crlf_endings_and_any_suffix_are_read(tmp_path):
    data = tmp_path / "pairs.txt"  # read as jsonl, as documented, whatever the suffix
    data.write_bytes(
        b'{"prompt": "1", "response": "2"}\r\n\r\n{"prompt": "3", "response": "4"}\r\n'
    )
    train, val = file_examples(SFTConfig(train_file=str(data), n_val=1))
    assert val == [{"prompt": "1", "response": "2"}] and train == [{"prompt": "3", "response": "4"}]


def test_a_broken_row_is_named_by_file_and_line(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "1", "response": "2"}\n\n{"prompt": "3", "resp\n', "utf-8")
    with pytest.raises(ConfigError, match=rf"{data}: row 3: invalid JSON"):
        file_examples(SFTConfig(train_file=str(data), n_val=0))


def test_a_row_that_is_not_an_object_is_named(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "1", "response": "2"}\n[1, 2]\n', "utf-8")
    with pytest.raises(ConfigError, match=rf"{data}: row 2: expected a JSON object"):
        file_examples(SFTConfig(train_file=str(data), n_val=0))


def test_a_file_no_longer_than_n_val_is_refused(tmp_path):
    data = tmp_path / "pairs.jsonl"
    _write_rows(data, [{"prompt": "1+1", "response": "2"}] * 3)
    with pytest.raises(ConfigError, match=r"has 3 rows; it needs more than SFTConfig.n_val = 3"):
        file_examples(SFTConfig(train_file=str(data), n_val=3))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(builtin_checkpoint())


def _trained_and_masked(response, tok):
    ids, mask = encode_example({"prompt": "2+3?", "response": response}, tok)
    trained = "".join(tok.decode([i]) for i, m in zip(ids, mask) if m)
    masked = "".join(tok.decode([i]) for i, m in zip(ids, mask) if not m)
    assert tok.decode(ids).endswith(response + "<|im_end|>")  # masking never changes the text
    return trained, masked


CODE = "```python\nprint(2+3)\n```\n```output"
END = "<|im_end|>"


@pytest.mark.parametrize(
    ("after_output", "env_text", "model_text"),
    [
        # As the RL tool writes it ("\n{result}\n```\n"): the fence's newline is the tool's.
        ("\n5\n```\nThe answer is \\boxed{5}.", "\n5\n```\n", "The answer is \\boxed{5}."),
        # No newline after the fence: the model's first character is the model's.
        ("\n5\n```The answer is \\boxed{5}.", "\n5\n```", "The answer is \\boxed{5}."),
        # CRLF text: the fence's line ending, "\r\n", is the tool's, as "\n" is in RL.
        ("\r\n5\r\n```\r\nThe answer is 5.", "\r\n5\r\n```\r\n", "The answer is 5."),
        # A fence followed by a blank line: only the first newline is the tool's.
        ("\n5\n```\n\nSo 5.", "\n5\n```\n", "\nSo 5."),
        # Fence at the very end, and an unclosed block: masked to the end.
        ("\n5\n```", "\n5\n```", ""),
        ("\n5\n", "\n5\n", ""),
    ],
)
def test_tool_output_span_ends_after_the_fence_and_its_newline(
    tok, after_output, env_text, model_text
):
    trained, masked = _trained_and_masked(CODE + after_output, tok)
    assert trained == CODE + model_text + END
    assert masked.endswith(env_text)


def test_two_tool_blocks_without_newlines_mask_only_the_tool_text(tok):
    response = (
        "```python\nprint(1)\n```\n```output\n1\n```ok "
        "```python\nprint(2)\n```\n```output\n2\n```done"
    )
    trained, masked = _trained_and_masked(response, tok)
    assert trained == (
        "```python\nprint(1)\n```\n```output"
        + "ok ```python\nprint(2)\n```\n```output"
        + "done"
        + END
    )
    assert masked.endswith("\n1\n```" + "\n2\n```")


def test_a_row_without_a_pair_or_an_episode_is_named(tmp_path):
    """A row holding neither prompt/response nor messages is refused as it is read, by file
    and line, not with a KeyError once training encodes it."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "1+1", "response": "2"}\n{"question": "2+2", "answer": "4"}\n')
    with pytest.raises(ConfigError, match=r"rows\.jsonl: row 2: expected 'prompt' and 'response'"):
        file_examples(SFTConfig(train_file=str(path), n_val=0))


def test_a_chat_messages_prompt_is_rendered_as_those_messages(tok):
    """A list prompt is the conversation before the response (`row_conversation`, as `rm` and
    `score` read it), not the Python text of the list; `system` replaces its system message."""
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 2+3?"}]
    ids, mask = encode_example({"prompt": chat, "response": "5"}, tok)
    prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == prompt + "5" + END
    assert "".join(tok.decode([i]) for i, m in zip(ids, mask) if m) == "5" + END
    ids, _ = encode_example({"system": "T", "prompt": chat, "response": "5"}, tok)
    swapped = [{"role": "system", "content": "T"}, chat[1]]
    prompt = tok.apply_chat_template(swapped, tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == prompt + "5" + END
    ids, _ = encode_example({"system": "", "prompt": chat, "response": "5"}, tok)
    prompt = tok.apply_chat_template(chat[1:], tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == prompt + "5" + END  # "": no system turn (DataConfig's rule)


USER, ASSISTANT = {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}
MALFORMED = [
    ({"prompt": 12345, "response": "5"}, "'prompt' must be a string or chat messages, got int"),
    ({"prompt": None, "response": "5"}, "'prompt' must be a string or chat messages, got null"),
    ({"prompt": [{"role": "user"}], "response": "5"}, "the prompt must be a string or a list"),
    ({"prompt": [], "response": "5"}, "the prompt is an empty list"),
    ({"prompt": "a", "response": None}, "'response' must be a string, got null"),
    ({"prompt": "a", "response": 5}, "'response' must be a string, got int"),
    ({"prompt": "a", "response": "b", "system": 3}, "'system' must be a string or null"),
    ({"messages": "hello"}, "'messages' must be a list of {'role': str, 'content': str}"),
    ({"messages": [USER]}, "an episode needs prompt messages, then at least one assistant"),
    (
        {"messages": [USER, ASSISTANT, USER, ASSISTANT]},
        "message 2: expected an assistant turn or its tool",
    ),
    ({"messages": [USER, ASSISTANT], "tools": "calc"}, "'tools' must be a list of"),
]


@pytest.mark.parametrize(("row", "reason"), MALFORMED, ids=[m[1][:40] for m in MALFORMED])
def test_a_malformed_row_is_refused_as_read_with_its_file_and_line(tmp_path, row, reason):
    path = tmp_path / "rows.jsonl"
    _write_rows(path, [{"prompt": "1+1", "response": "2"}, row])
    with pytest.raises(ConfigError) as e:
        file_examples(SFTConfig(train_file=str(path), n_val=0))
    assert str(e.value).startswith(f"SFTConfig.train_file: {path}: row 2: {reason}"), e.value


def test_a_malformed_row_stops_the_command_in_one_line(tmp_path, capsys):
    from jaxrl_llm import cli

    path, out = tmp_path / "rows.jsonl", tmp_path / "out"
    _write_rows(path, [{"prompt": "1+1", "response": "2"}, {"prompt": "a", "response": None}])
    params = [
        f"SFTConfig.train_file = '{path}'",
        f"SFTConfig.out_dir = '{out}'",
        "SFTConfig.n_val = 0",
    ]
    assert cli.main(["sft", *[a for p in params for a in ("--gin_param", p)]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxrl-llm sft: configuration error: "), err
    assert f"{path}: row 2: 'response' must be a string" in err[0]
    assert not out.exists()  # refused before config.gin is written or the model loads


@pytest.mark.parametrize("levels", [(9,), (), (1, 0)])
def test_levels_outside_the_builtin_task_are_refused(levels, tmp_path, capsys):
    from jaxrl_llm import cli
    from jaxrl_llm.learner.reward_training import RMConfig

    with pytest.raises(ConfigError, match=r"SFTConfig.levels = .*expected one or more of"):
        SFTConfig(levels=levels)
    with pytest.raises(ConfigError, match=r"RMConfig.levels = .*expected one or more of"):
        RMConfig(levels=levels).validate()
    out = tmp_path / "out"
    params = [f"SFTConfig.levels = {levels!r}", f"SFTConfig.out_dir = '{out}'"]
    assert cli.main(["sft", *[a for p in params for a in ("--gin_param", p)]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxrl-llm sft: configuration error: "), err
    assert "SFTConfig.levels" in err[0] and not out.exists()

"""Which column of a data row becomes the policy's prompt, and which rows are refused: a
`messages` column never smuggles a reference solution into the prompt, blank answers and
empty conversations are malformed, and `score` / `rm` / reward models pick a row's
conversation by one rule."""

import json

import pytest

from jaxrl_llm.data.examples import DEFAULT_FIELDS, FieldMap, load_examples, normalize_row
from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.preferences import BadPreferenceRow, check_pair, read_preferences
from jaxrl_llm.data.sources import SourceConfig
from jaxrl_llm.data.templates import prompt_messages, render_prompt
from jaxrl_llm.rewards.model import conversation
from jaxrl_llm.rollout.score_cli import BadScoreRow, check_row

SOLUTION = r"3+3=6, so \boxed{6}"
NUMINA = {  # NuminaMath-CoT / OpenR1-Math: problem, solution, and the chat as `messages`
    "problem": "What is 3+3?",
    "solution": SOLUTION,
    "messages": [
        {"role": "user", "content": "What is 3+3?"},
        {"role": "assistant", "content": SOLUTION},
    ],
}


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_messages_column_never_reaches_the_prompt(tmp_path, char_tokenizer):
    example = normalize_row(NUMINA, DEFAULT_FIELDS, default_id="n:1")
    assert example["prompt"] == "What is 3+3?" and example["answer"] == SOLUTION
    assert "messages" not in example  # the raw column is dropped, not passed through
    for template in ("raw", "chat"):
        assert prompt_messages(example, template) == [{"role": "user", "content": "What is 3+3?"}]
    path = _write(tmp_path / "numina.jsonl", [NUMINA, {**NUMINA, "problem": "What is 4+4?"}])
    config = PipelineConfig(SourceConfig(path), template="raw", global_batch_size=2, shuffle=False)
    pipe = build_prompt_pipeline(config, char_tokenizer)
    assert [p.text for p in pipe.prompts] == ["What is 3+3?", "What is 4+4?"]


def test_a_malformed_unused_messages_column_neither_crashes_nor_matters(tmp_path, char_tokenizer):
    rows = [
        {"question": "What is 1+1?", "answer": "2"},
        {"question": "What is 3+3?", "answer": "6", "messages": "oops"},
    ]
    config = PipelineConfig(
        SourceConfig(_write(tmp_path / "x.jsonl", rows)), template="raw", global_batch_size=1
    )
    pipe = build_prompt_pipeline(config, char_tokenizer)
    assert sorted(p.text for p in pipe.prompts) == ["What is 1+1?", "What is 3+3?"]
    assert pipe.report.malformed == []


def test_a_prompt_given_as_messages_ends_before_its_assistant_turns(tmp_path):
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "What is 3+3?"}
    shot = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    answer = {"role": "assistant", "content": SOLUTION}
    fields = DEFAULT_FIELDS
    ex = normalize_row({"prompt": [system, user, answer], "answer": "6"}, fields, default_id="a")
    assert ex["messages"] == [system, user] and ex["prompt"] == "What is 3+3?"
    assert render_prompt(ex, "raw") == "Be brief.\nWhat is 3+3?"
    # Few-shot turns before the question are kept; only the trailing assistant turns go.
    ex = normalize_row(
        {"prompt": [*shot, user, answer, answer], "answer": "6"}, fields, default_id="b"
    )
    assert ex["messages"] == [*shot, user]
    # A `messages` column is the prompt only when named as the prompt field.
    custom = FieldMap(prompt=("messages",))
    ex = normalize_row({"messages": [user, answer], "answer": "6"}, custom, default_id="c")
    assert ex["messages"] == [user] and ex["prompt"] == "What is 3+3?"
    with pytest.raises(ValueError, match=r"DataConfig\.prompt_key"):
        normalize_row({"messages": [user, answer], "answer": "6"}, fields, default_id="d")
    bad = [{"prompt": p, "answer": "6"} for p in ([answer], [user, "oops"], [{"role": "user"}], [])]
    examples, report = load_examples(SourceConfig(_write(tmp_path / "p.jsonl", bad)))
    assert examples == [] and [b.line for b in report.malformed] == [1, 2, 3, 4]
    assert "no non-empty user message" in report.malformed[0].reason


def test_blank_answers_are_malformed(tmp_path):
    answers = ["", "   ", [], [""], ["4", " "], ["8", 8], "10", 0]
    rows = [{"question": f"What is {i}+{i}?", "answer": a} for i, a in enumerate(answers)]
    examples, report = load_examples(SourceConfig(_write(tmp_path / "a.jsonl", rows)))
    assert [e["answer"] for e in examples] == [["8", "8"], "10", "0"]
    assert [b.line for b in report.malformed] == [1, 2, 3, 4, 5]
    assert all("answer" in b.reason for b in report.malformed), report.malformed
    assert report.summary().startswith("3 prompts kept of 8 rows read; 5 malformed rows skipped")


EMPTY = {  # rows with no conversation before the response
    "empty messages": {"messages": []},
    "empty messages beside a prompt": {"prompt": "2+3?", "messages": []},
    "blank prompt": {"prompt": "  "},
    "empty prompt list": {"prompt": []},
    "messages as a string": {"messages": "2+3?"},
}


@pytest.mark.parametrize("case", sorted(EMPTY))
def test_score_rm_and_reward_models_refuse_a_row_without_a_conversation(tmp_path, case):
    row = EMPTY[case]
    with pytest.raises(BadScoreRow, match=r"^row 2: "):
        check_row({**row, "response": "5"}, "row 2")
    with pytest.raises(BadPreferenceRow, match=r"^row 2: "):
        check_pair({**row, "chosen": "5", "rejected": "6"}, "row 2")
    with pytest.raises(ValueError):
        conversation(row, "5")
    good = {"prompt": "2+3?", "chosen": "5", "rejected": "6"}
    path = _write(tmp_path / "pairs.jsonl", [good, {**row, "chosen": "5", "rejected": "6"}])
    with pytest.raises(BadPreferenceRow, match=r"pairs\.jsonl: row 2: "):
        read_preferences(path)


def test_score_rm_and_reward_models_pick_the_same_conversation():
    user = {"role": "user", "content": "2+3?"}
    for row in ({"prompt": "2+3?"}, {"prompt": [user]}, {"prompt": "ignored", "messages": [user]}):
        assert conversation(row, "5") == [user, {"role": "assistant", "content": "5"}]
        assert check_pair({**row, "chosen": "5", "rejected": "6"}, "x")["chosen"] == "5"
        scored = check_row({**row, "response": "5"}, "x")
        assert conversation(scored, "5") == conversation(row, "5")

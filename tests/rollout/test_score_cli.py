"""`jaxrl-llm score`: a data file's responses scored by a rule reward, a reward model folder,
and a gin-configured weighted sum; a malformed row ends the command with one line."""

import json

import gin
import numpy as np
import pytest

from jaxrl_llm import cli
from jaxrl_llm.rewards.model import RewardModel
from jaxrl_llm.rollout.score_cli import read_rows
from jaxrl_llm.testing import write_reward_model

ROWS = [
    {"id": "a", "prompt": "What is 2 + 3?", "answer": "5", "response": r"So \boxed{5}."},
    {"id": "b", "prompt": "What is 2 * 3?", "answer": "6", "response": r"\boxed{5}"},
    {"messages": [{"role": "user", "content": "Half of 8?"}], "answer": "4",
     "response": "The answer is 4."},
]  # fmt: skip


@pytest.fixture
def clean_gin():
    yield
    gin.clear_config()


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _score(capsys, *argv) -> tuple[int, list[dict]]:
    code = cli.main(["score", *argv])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_score_with_a_rule_reward(tmp_path, capsys, clean_gin):
    data = _write(tmp_path / "rows.jsonl", ROWS)
    code, lines = _score(capsys, "--reward", "math", "--data", data,
                         "--gin_param", "RewardConfig.workers = 1")  # fmt: skip
    assert code == 0
    assert lines == [
        {"row": 1, "score": 1.0, "id": "a"},
        {"row": 2, "score": 0.0, "id": "b"},
        {"row": 3, "score": 1.0},
    ]


def test_score_with_a_reward_model_folder_and_a_weighted_sum(tmp_path, capsys, clean_gin):
    folder = tmp_path / "rm"
    write_reward_model(folder, "qwen2", seed=4)
    data = _write(tmp_path / "rows.jsonl", ROWS)
    expected = RewardModel(folder).score(
        [r["response"] for r in ROWS], [r for _, r in read_rows(data)]
    )
    code, lines = _score(capsys, "--reward", f"rm:{folder}", "--data", data)
    assert code == 0
    assert [line["row"] for line in lines] == [1, 2, 3]
    np.testing.assert_array_equal([line["score"] for line in lines], expected)
    weights = f'RewardConfig.weights = {{"math": 1.0, "rm:{folder}": 0.5}}'
    code, lines = _score(capsys, "--data", data, "--gin_param", weights,
                         "--gin_param", "RewardConfig.workers = 1")  # fmt: skip
    assert code == 0
    # The same model on the same rows scores the same, and the sum is float32's, added in the
    # documented order (`ModelAndRuleRewards`: rules + weight * model): equal, not close.
    np.testing.assert_array_equal([line["parts"][f"rm:{folder.name}"] for line in lines], expected)
    total = np.float32([1.0, 0.0, 1.0]) + np.float32(0.5) * expected
    np.testing.assert_array_equal([line["score"] for line in lines], total)


BAD_ROWS = {
    "no_response": ({"prompt": "q"}, "row 2: no 'response' string (fields: ['prompt'])"),
    "no_prompt": ({"response": "r"}, "row 2: no 'prompt' or 'messages' (fields: ['response'])"),
    "bad_messages": (
        {"messages": [{"role": "user"}], "response": "r"},
        "row 2: 'messages' must be a list of {'role': str, 'content': str} messages",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_malformed_row_ends_the_command_with_one_line(tmp_path, capsys, clean_gin, case):
    row, message = BAD_ROWS[case]
    data = _write(tmp_path / "rows.jsonl", [ROWS[0], row])
    assert cli.main(["score", "--reward", "math", "--data", data]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"jaxrl-llm score: configuration error: {data}: {message}"


def test_an_unknown_reward_or_folder_ends_the_command_with_one_line(tmp_path, capsys, clean_gin):
    data = _write(tmp_path / "rows.jsonl", ROWS)
    assert cli.main(["score", "--reward", "nonesuch", "--data", data]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("jaxrl-llm score: configuration error: --reward: ")
    assert "unknown reward 'nonesuch'" in err
    assert cli.main(["score", "--reward", f"rm:{tmp_path / 'no'}", "--data", data]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"jaxrl-llm score: configuration error: --reward '{tmp_path / 'no'}': ")
    assert "no such folder" in err

"""The agent miniature's preparation with a stand-in for SFT (no training): worked episodes
of the built-in environment as {messages, tools} rows, one checkpoint for the arm."""

import json
import re

from jaxrl_llm.agents.arithmetic import ArithmeticEnv
from jaxrl_llm.repro import agent_stage
from jaxrl_llm.repro.specs import PrepOptions, get_repro


def test_episodes_are_written_and_the_arm_starts_from_their_sft(tmp_path, monkeypatch):
    calls = []

    def fake_sft(gin_files, params):
        calls.append((gin_files, params))
        hf = tmp_path / "sft/agent/hf"
        hf.mkdir(parents=True, exist_ok=True)
        (hf / "config.json").write_text("{}")
        return {"val/loss": 0.25}

    monkeypatch.setattr(agent_stage, "sft_run", fake_sft)
    monkeypatch.setattr(agent_stage, "N_PROBLEMS", 20)
    prepared = agent_stage.prepare_agent(PrepOptions(tmp_path, (0, 1), prep_steps=3))
    ((gin_files, params),) = calls
    assert gin_files == ["agent_sft_tiny.gin"] and params[2] == "SFTConfig.steps = 3"
    rows = [json.loads(x) for x in (tmp_path / "sft_data/episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and all(r["tools"] == ArithmeticEnv().tools for r in rows)
    answer = re.compile(r"(^|\n)The answer is \\boxed\{[^}]+\}\.$")
    assert all(answer.search(r["messages"][-1]["content"]) for r in rows)
    assert prepared.params("grpo", 1) == (f"CHECKPOINT = '{tmp_path / 'sft/agent/hf'}'",)
    assert prepared.notes["grpo"]["sft_val_loss"] == 0.25
    assert get_repro("agent").prepare_fn() is agent_stage.prepare_agent
    # The same settings again: the finished SFT is reused, not trained again.
    again = agent_stage.prepare_agent(PrepOptions(tmp_path, (0,), prep_steps=3))
    assert len(calls) == 1 and again.notes["grpo"]["reused"] is True
    assert again.notes["grpo"]["sft_val_loss"] == 0.25
    # Another budget is another SFT.
    agent_stage.prepare_agent(PrepOptions(tmp_path, (0,), prep_steps=4))
    assert len(calls) == 2 and calls[1][1][2] == "SFTConfig.steps = 4"


def test_a_tool_share_below_one_mixes_in_episodes_solved_in_words(tmp_path, monkeypatch):
    monkeypatch.setattr(agent_stage, "sft_run", lambda gin_files, params: {"val/loss": 0.5})
    monkeypatch.setattr(agent_stage, "N_PROBLEMS", 40)
    monkeypatch.setattr(agent_stage, "TOOL_SHARE", 0.5)
    agent_stage.prepare_agent(PrepOptions(tmp_path, (0,), prep_steps=3))
    rows = [json.loads(x) for x in (tmp_path / "sft_data/episodes.jsonl").read_text().splitlines()]
    words = [r for r in rows if len(r["messages"]) == 2]
    assert 10 <= len(words) <= 30 and all(r["tools"] == ArithmeticEnv().tools for r in rows)
    for r in words:
        text = r["messages"][1]["content"]
        assert "<tool_call>" not in text and text.endswith("}.") and "\\boxed{" in text
    called = [r for r in rows if r not in words]
    assert all(r["messages"][1]["content"].startswith("<tool_call>") for r in called)

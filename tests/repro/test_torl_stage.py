"""ToRL's preparation with a stand-in for SFT (no training): both arms get the same prompts
and budget, their own response style, and their own checkpoint."""

import json

import pytest

from jaxrl_llm.repro import torl_stage
from jaxrl_llm.repro.specs import PrepOptions


def test_each_arm_gets_its_own_sft_data_and_checkpoint(tmp_path, monkeypatch):
    calls = []

    def fake_sft(gin_files, params):
        calls.append((gin_files, params))
        out = params[1].split("'")[1]  # SFTConfig.out_dir's value
        (tmp_path / out / "hf").mkdir(parents=True, exist_ok=True)
        (tmp_path / out / "hf" / "config.json").write_text("{}")
        return {"val/loss": 0.5}

    monkeypatch.setattr(torl_stage, "sft_run", fake_sft)
    monkeypatch.setattr(torl_stage, "N_PROBLEMS", 40)
    prepared = torl_stage.prepare_torl(PrepOptions(tmp_path, (0, 1), prep_steps=3))
    assert [c[0] for c in calls] == [["torl_sft_tiny.gin"]] * 2
    for (_, params), arm in zip(calls, ("tool", "no_tool")):
        assert params[1] == f"SFTConfig.out_dir = '{tmp_path / 'sft' / arm}'"
        assert params[2] == "SFTConfig.steps = 3"  # the same budget for both
        assert prepared.params(arm, 1) == (f"CHECKPOINT = '{tmp_path / 'sft' / arm / 'hf'}'",)
    tool = [json.loads(x) for x in (tmp_path / "sft_data/tool.jsonl").read_text().splitlines()]
    text = [json.loads(x) for x in (tmp_path / "sft_data/stepwise.jsonl").read_text().splitlines()]
    assert len(tool) == len(text) == 40
    assert [r["prompt"] for r in tool] == [r["prompt"] for r in text]
    assert all("```python" in r["response"] for r in tool)
    assert not any("```" in r["response"] for r in text)
    assert prepared.notes["no_tool"]["sft_style"] == "stepwise"
    assert prepared.notes["tool"]["sft_val_loss"] == 0.5
    # The same settings again: both finished SFTs are reused, not trained again (a resumed
    # reproduction keeps its checkpoints); another budget trains both again.
    again = torl_stage.prepare_torl(PrepOptions(tmp_path, (0,), prep_steps=3))
    assert len(calls) == 2 and again.notes["tool"]["reused"] is True
    assert again.notes["no_tool"] == {**prepared.notes["no_tool"], "reused": True}
    torl_stage.prepare_torl(PrepOptions(tmp_path, (0,), prep_steps=4))
    assert len(calls) == 4 and calls[3][1][2] == "SFTConfig.steps = 4"
    # A training that dies leaves no record: its checkpoint may be half overwritten.
    monkeypatch.setattr(torl_stage, "sft_run", lambda *a: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError, match="killed"):
        torl_stage.prepare_torl(PrepOptions(tmp_path, (0,), prep_steps=3))
    assert not (tmp_path / "sft" / "tool" / "prepared.json").exists()

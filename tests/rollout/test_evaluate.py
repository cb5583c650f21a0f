"""`jaxrl-llm eval` end to end on the shipped tiny model."""

import json

import numpy as np
import pytest

from jaxrl_llm import cli


def test_eval_command_end_to_end_on_the_tiny_model(tmp_path, capsys):
    out = tmp_path / "eval.json"
    argv = ["eval", "--checkpoint", "builtin", "--data", "builtin", "--limit", "4",
            "--max-new-tokens", "16", "--n", "2", "--temperature", "1.0", "--k", "1", "2",
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["problems"] == 4 and summary["n"] == 2
    for key in ("pass@1", "pass@2", "maj@1", "maj@2"):
        assert 0.0 <= summary[key] <= 1.0, key
    rows = result["samples"]
    assert len(rows) == 4
    for row in rows:
        assert set(row) == {"id", "answer", "correct", "answers", "texts"}
        assert len(row["texts"]) == len(row["correct"]) == len(row["answers"]) == 2
    # With n = 2: pass@1 is the mean fraction correct, pass@2 the fraction of problems solved.
    assert summary["pass@1"] == pytest.approx(np.mean([np.mean(r["correct"]) for r in rows]))
    assert summary["pass@2"] == pytest.approx(np.mean([any(r["correct"]) for r in rows]))
    printed = capsys.readouterr().out
    assert "pass@2" in printed and "maj@2" in printed

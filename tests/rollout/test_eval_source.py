"""`jaxrl-llm eval`'s built-in prompt set: each eval reads a file of its own, removed when the
eval ends, so two evals on one host (or one with another --limit) never read each other's."""

import argparse
import tempfile
from pathlib import Path

import pytest

from jaxrl_llm.data.sources import read_records
from jaxrl_llm.rollout import evaluate


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    return parser.parse_args(["--checkpoint", "builtin", *argv])


def _ids(source) -> list[str]:
    return [record.row["id"] for record in read_records(source)]


def test_two_builtin_sources_keep_their_own_rows():
    with (
        evaluate._source(_args("--limit", "100")) as first,
        evaluate._source(_args("--data", "builtin", "--limit", "3")) as second,
    ):
        first_ids, second_ids = _ids(first), _ids(second)
        assert first.path != second.path
    assert len(first_ids) == 100 and len(second_ids) == 3
    assert second_ids == first_ids[:3]  # the same fixed problems, each its own file
    assert not Path(first.path).exists() and not Path(second.path).exists()


def test_the_builtin_file_is_removed_when_the_eval_ends(monkeypatch, tmp_path):
    """The eval stops after its source is made (here: the model fails to load); the file it
    wrote was there while it ran and is gone afterwards."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = []

    def load_fails(args):
        seen.extend(p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl"))
        raise RuntimeError("no model here")

    monkeypatch.setattr(evaluate, "load_sampling_model", load_fails)
    with pytest.raises(RuntimeError, match="no model here"):
        evaluate.evaluate(_args("--limit", "5"))
    assert len(seen) == 1 and seen[0].name == "builtin_val.jsonl"
    assert list(tmp_path.iterdir()) == []


def test_a_file_source_is_passed_through(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "q", "answer": "1"}\n')
    with evaluate._source(_args("--data", str(data), "--split", "dev")) as source:
        assert (source.path, source.split) == (str(data), "dev")
    assert data.exists()  # a user's file is never removed

"""Command-line inputs that must end in one `ConfigError` line (exit 2) before anything is
written or a model loads: `limr select`, `eval`, `score`, `plot`."""

import json

import pytest

from jaxrl_llm import cli
from jaxrl_llm.data import limr

ROWS = [{"id": f"q{i}", "prompt": f"{i}+1?", "answer": str(i + 1)} for i in range(3)]


def refused(capsys, *argv) -> str:
    """Runs the command; it must exit 2 with one line on stderr, and return that line."""
    assert cli.main([*map(str, argv)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture
def lim_files(tmp_path):
    import numpy as np

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    scores = tmp_path / "scores.json"
    limr.LimScores(
        ids=[r["id"] for r in ROWS], accuracy=np.zeros((3, 2)),
        scores=np.array([0.9, 0.1, 0.8]), mean_curve=np.zeros(2), dropped=[], backfilled=0,
        steps_per_epoch=1, epochs=2, correct_reward=1.0,
    ).save(scores)  # fmt: skip
    return scores, data


@pytest.mark.parametrize("mode", [[], ["--random", "1"]])
def test_limr_select_refuses_to_overwrite_its_data(lim_files, capsys, mode):
    scores, data = lim_files
    before = data.read_bytes()
    same = data.parent / "." / data.name  # another spelling of the same file
    line = refused(capsys, "limr", "select", "--scores", scores, "--data", data, "--out", same,
                   *mode)  # fmt: skip
    assert "--out" in line and "--data" in line
    assert data.read_bytes() == before


def test_limr_select_refuses_a_folder_out(lim_files, capsys):
    scores, data = lim_files
    folder = data.parent / "sub"
    folder.mkdir()
    line = refused(capsys, "limr", "select", "--scores", scores, "--data", data, "--out", folder)
    assert "--out" in line and "folder" in line and not list(folder.iterdir())


@pytest.fixture
def no_model(monkeypatch):
    """`eval` must refuse before it loads a model."""

    def fail(*_):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("jaxrl_llm.rollout.evaluate.load_sampling_model", fail)


def test_eval_refuses_a_folder_out(tmp_path, capsys, no_model):
    line = refused(capsys, "eval", "--limit", 1, "--out", tmp_path)
    assert "--out" in line and "folder" in line


def test_eval_refuses_an_out_under_a_file(tmp_path, capsys, no_model):
    file = tmp_path / "f.txt"
    file.write_text("x")
    line = refused(capsys, "eval", "--limit", 1, "--out", file / "r.json")
    assert "--out" in line and str(file) in line


def test_eval_refuses_more_tokens_than_the_models_context(capsys, no_model):
    line = refused(capsys, "eval", "--limit", 1, "--max-new-tokens", 100_000_000)
    assert "max_position_embeddings" in line
    # eval's own flags are named, not the training config's fields
    assert "--max-prompt-length + --max-new-tokens = " in line and "DataConfig" not in line


def test_score_refuses_an_empty_file(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = refused(capsys, "score", "--reward", "math", "--data", empty)
    assert str(empty) in line and "no row" in line


def test_plot_refuses_a_non_utf8_metrics_file(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1, "x": "\xff\xfe"}\n')
    line = refused(capsys, "plot", tmp_path)
    assert "metrics.jsonl" in line and "UTF-8" in line


def test_plot_refuses_an_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    out = tmp_path / "out.png"
    out.write_text("keep")
    line = refused(capsys, "plot", tmp_path, "--out", out)
    assert "--out" in line and out.read_text() == "keep"


def test_read_tfds_names_a_missing_dataset(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    from jaxrl_llm.data.sources import DataSourceError, read_tfds

    with pytest.raises(DataSourceError, match="nosuch_dataset_xyz"):
        next(read_tfds("nosuch_dataset_xyz", data_dir=str(tmp_path)))


def test_eval_refuses_a_missing_tfds_dataset(tmp_path, capsys, no_model):
    pytest.importorskip("tensorflow_datasets")
    line = refused(capsys, "eval", "--data", "tfds:nosuch_dataset_xyz", "--data-dir", tmp_path)
    assert "nosuch_dataset_xyz" in line

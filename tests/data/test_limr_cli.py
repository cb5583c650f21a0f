"""`jaxrl-llm limr score|select` on a fake run directory."""

import json

import numpy as np
import pytest

from jaxrl_llm import cli
from jaxrl_llm.data import limr

# Per prompt, per step (2 steps per epoch, 3 epochs): how many of its 2 samples are correct.
CORRECT = {
    "q000": [0, 1, 1, 2, 2, 2],  # accuracy 0.25, 0.75, 1.0
    "q001": [0, 0, 1, 1, 2, 2],  # 0.0, 0.5, 1.0
    "q002": [2, 2, 0, 0, 1, 1],  # 1.0, 0.0, 0.5
    "q003": [1, 1, 1, 1, 1, 1],  # 0.5, 0.5, 0.5
}
ACCURACY = np.array([[0.25, 0.75, 1.0], [0.0, 0.5, 1.0], [1.0, 0.0, 0.5], [0.5, 0.5, 0.5]])


def run_cli(capsys, *argv):
    assert cli.main(["limr", *map(str, argv)]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture
def run_dir(tmp_path):
    """samples/step_N.jsonl for steps 1-6, written by `limr.record_samples`; "q004" only
    appears in the first epoch, so it is dropped; rewards are 1 (correct) or -1."""
    run = tmp_path / "run"
    for step in range(1, 7):
        ids, rewards = [], []
        for pid, correct in CORRECT.items():
            ids += [pid, pid]
            rewards += [1.0] * correct[step - 1] + [-1.0] * (2 - correct[step - 1])
        if step <= 2:
            ids, rewards = [*ids, "q004"], [*rewards, 1.0]
        limr.record_samples(run, step, ids, rewards)
    return run


def test_score_writes_scores_and_plot(run_dir, capsys):
    report = run_cli(capsys, "score", "--run", run_dir, "--steps-per-epoch", 2, "--epochs", 3)
    scores = limr.load_scores(run_dir / limr.SCORES_FILE)
    assert scores.ids == list(CORRECT) and scores.dropped == ["q004"]
    np.testing.assert_allclose(scores.accuracy, ACCURACY, atol=1e-12)
    np.testing.assert_allclose(scores.scores, limr.lim_scores(ACCURACY), atol=1e-12)
    expected_selected = int((limr.lim_scores(ACCURACY) >= 0.6).sum())
    assert report["prompts"] == 4 and report["dropped"] == 1
    assert report["selected"] == expected_selected
    png = run_dir / "lim_curves.png"
    assert report["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_score_custom_paths_and_correct_reward(run_dir, tmp_path, capsys):
    out, plot = tmp_path / "s.json", tmp_path / "p.png"
    # A sample is correct at reward >= --correct-reward: at -1.5 every sample (rewards 1 and
    # -1) is, so every accuracy is 1.
    args = ["--run", run_dir, "--steps-per-epoch", 2, "--epochs", 3, "--correct-reward", -1.5]
    report = run_cli(capsys, "score", *args, "--out", out, "--plot", plot)
    np.testing.assert_array_equal(limr.load_scores(out).accuracy, np.ones_like(ACCURACY))
    assert plot.exists() and report["scores"] == str(out)
    report = run_cli(capsys, "score", *args, "--out", out, "--no-plot")
    assert "plot" not in report


def write_scores(path, ids, scores):
    limr.LimScores(
        ids=list(ids),
        accuracy=np.zeros((len(ids), 2)),
        scores=np.asarray(scores, np.float64),
        mean_curve=np.zeros(2),
        dropped=[],
        backfilled=0,
        steps_per_epoch=1,
        epochs=2,
        correct_reward=1.0,
    ).save(path)


@pytest.fixture
def scored_data(tmp_path, math_rows):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in math_rows(10)))
    # q000..q009 scored 0.0, 0.1, ..., 0.9 (q003 exactly 0.3 -- a float that must compare
    # inclusively), plus an id that is not in the data.
    ids = [f"q{i:03d}" for i in range(10)] + ["missing"]
    write_scores(tmp_path / "scores.json", ids, [i / 10 for i in range(10)] + [1.0])
    return data, tmp_path / "scores.json"


def test_select_keeps_threshold_inclusive_in_data_format(scored_data, tmp_path, capsys):
    data, scores = scored_data
    out = tmp_path / "lim.jsonl"
    report = run_cli(
        capsys, "select", "--scores", scores, "--data", data, "--threshold", 0.3, "--out", out
    )
    lines = data.read_text().splitlines(keepends=True)
    assert out.read_text() == "".join(lines[3:])  # q003..q009, byte for byte
    assert report == {"out": str(out), "threshold": 0.3, "mode": "lim", "prompts": 7}


def test_random_baseline_size_and_determinism(scored_data, tmp_path, capsys):
    data, scores = scored_data
    common = ["select", "--scores", scores, "--data", data, "--threshold", 0.6]
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    report = run_cli(capsys, *common, "--random", "--seed", 3, "--out", a)
    # Same size as the LIM subset at 0.6 (q006..q009; "missing" is not in the data).
    assert report["mode"] == "random" and report["prompts"] == 4
    assert len(a.read_text().splitlines()) == 4
    run_cli(capsys, *common, "--random", "--seed", 3, "--out", b)
    assert a.read_text() == b.read_text()
    report = run_cli(capsys, *common, "--random", 6, "--seed", 3, "--out", c)
    assert report["prompts"] == 6 and len(c.read_text().splitlines()) == 6
    seeds = set()
    for seed in range(5):
        run_cli(capsys, *common, "--random", "--seed", seed, "--out", c)
        seeds.add(c.read_text())
    assert len(seeds) > 1


def test_help_and_missing_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    assert "limr" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["limr"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["limr", "select", "--help"])
    assert e.value.code == 0
    assert "--random" in capsys.readouterr().out


def cli_error(capsys, *argv):
    """Runs ``jaxrl-llm limr ARGV`` expecting the one-line configuration error (exit 2)."""
    assert cli.main(["limr", *map(str, argv)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("jaxrl-llm limr: configuration error: ")
    return lines[0]


def test_score_refuses_epochs_the_run_did_not_record(run_dir, capsys):
    """6 steps recorded, 4 epochs of 2 asked: a clean error naming what can be scored."""
    line = cli_error(capsys, "score", "--run", run_dir, "--steps-per-epoch", 2, "--epochs", 4)
    assert "step_6.jsonl" in line and "3 whole epochs" in line and "--epochs 3" in line
    assert not (run_dir / limr.SCORES_FILE).exists()


def test_score_bad_arguments_end_in_one_line(run_dir, tmp_path, capsys):
    line = cli_error(capsys, "score", "--run", run_dir, "--steps-per-epoch", 0, "--epochs", 3)
    assert "steps_per_epoch must be >= 1, got 0" in line
    missing = tmp_path / "missing"
    line = cli_error(capsys, "score", "--run", missing, "--steps-per-epoch", 2, "--epochs", 3)
    assert str(missing) in line and "no such folder" in line


def test_select_bad_arguments_end_in_one_line(scored_data, tmp_path, capsys):
    data, scores = scored_data  # 10 rows; scores 0.0 .. 0.9
    common = ["select", "--scores", scores, "--data", data, "--out", tmp_path / "o.jsonl"]
    line = cli_error(capsys, *common, "--random", 11)
    assert "a random subset of 11 prompts" in line and "has 10" in line
    line = cli_error(capsys, *common, "--threshold", 1.5)
    assert "no prompt has LIM score >= 1.5 (the highest of the 11 scored is 1)" in line
    line = cli_error(capsys, *common, "--threshold", 1.5, "--random")
    assert "no prompt has LIM score >= 1.5" in line
    line = cli_error(capsys, *common, "--threshold", 0.95)  # only "missing", not in the data
    assert "none of the 1 prompts with LIM score >= 0.95 is in" in line and "--id-key" in line
    line = cli_error(capsys, "select", "--scores", tmp_path / "nope.json", "--data", data,
                     "--out", tmp_path / "o.jsonl")  # fmt: skip
    assert "nope.json" in line and "no such file" in line
    assert not (tmp_path / "o.jsonl").exists()


def test_select_on_arrow_data_ends_in_one_line(scored_data, tmp_path, capsys, math_rows):
    import pyarrow as pa
    import pyarrow.ipc as ipc

    _, scores = scored_data
    data = tmp_path / "train.arrow"
    table = pa.Table.from_pylist(math_rows(10))
    with ipc.new_file(str(data), table.schema) as writer:
        writer.write_table(table)
    out = tmp_path / "o.arrow"
    line = cli_error(capsys, "select", "--scores", scores, "--data", data, "--out", out)
    assert f"selection writes jsonl, json or parquet: convert {data} to one of them" in line
    assert not out.exists()

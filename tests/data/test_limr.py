"""LIMR: LIM scores by hand, sample records, back-fill and drop, selection, RAND, the plot."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data import limr
from jaxrl_llm.data.limr import (
    backfill_and_drop,
    lim_scores,
    load_scores,
    record_samples,
    score_run,
)
from jaxrl_llm.data.limr_select import lim_subset_size, random_ids, random_subset, select

NAN = np.nan


def test_lim_scores_by_hand():
    # Mean curve (0.5, 0.5); denominator (1-0.5)^2 * 2 = 0.5.
    r = np.array([[0.0, 0.5], [0.5, 0.5], [1.0, 0.5]])
    np.testing.assert_allclose(lim_scores(r), [1 - 0.25 / 0.5, 1.0, 1 - 0.25 / 0.5], atol=1e-12)
    # Mean curve (1/2, 2/3); denominator 1/4 + 1/9 = 13/36.
    r = np.array([[0.0, 1.0], [1.0, 1.0], [0.5, 0.0]])
    expected = [1 - (13 / 36) / (13 / 36), 1 - (13 / 36) / (13 / 36), 1 - (4 / 9) / (13 / 36)]
    np.testing.assert_allclose(lim_scores(r), expected, atol=1e-12)


def test_lim_scores_degenerate_and_invalid_inputs(caplog):
    with caplog.at_level("WARNING"):
        np.testing.assert_array_equal(lim_scores(np.ones((3, 4))), np.ones(3))
    assert "all defined as 1" in caplog.text
    assert lim_scores(np.zeros((0, 5))).shape == (0,)
    for bad in (np.zeros(3), np.array([[0.5, NAN]]), np.array([[1.5]]), np.zeros((2, 0))):
        with pytest.raises(ValueError):
            lim_scores(bad)


def test_backfill_from_the_next_epoch_only_then_drop():
    acc = np.array(
        [
            [NAN, 1.0, 0.0],  # filled from epoch 1
            [0.0, NAN, 1.0],  # filled from epoch 2
            [NAN, NAN, 1.0],  # epoch 1 was missing too: epoch 0 stays missing (LIMR's rule)
            [1.0, 0.5, NAN],  # the last epoch has nothing after it
            [0.5, 0.5, 0.5],
        ]
    )
    filled, complete, n_filled = backfill_and_drop(acc)
    np.testing.assert_array_equal(complete, [True, True, False, False, True])
    np.testing.assert_array_equal(filled[0], [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(filled[1], [0.0, 1.0, 1.0])
    assert n_filled == 3  # row 0 epoch 0, row 1 epoch 1, row 2 epoch 1


def test_record_samples_writes_atomically_named_files(tmp_path):
    path = record_samples(tmp_path, 3, ["a", "a", "b"], np.array([1.0, 0.0, 1.0]))
    assert path == tmp_path / "samples" / "step_3.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"step": 3, "prompt_id": "a", "reward": 1.0}
    assert len(lines) == 3
    assert record_samples(tmp_path, 3, ["c"], [0.5], process_index=2).name == "step_3.p2.jsonl"
    assert sorted(p.name for p in path.parent.iterdir()) == ["step_3.jsonl", "step_3.p2.jsonl"]
    with pytest.raises(ValueError, match="2 prompt ids but 1 rewards"):
        record_samples(tmp_path, 4, ["a", "b"], [1.0])


def _record_run(run_dir, accuracy_by_prompt, samples_per_cell=4):
    """One step per epoch; each prompt gets samples whose correct fraction is its accuracy."""
    epochs = len(next(iter(accuracy_by_prompt.values())))
    for epoch in range(epochs):
        ids, rewards = [], []
        for pid, curve in accuracy_by_prompt.items():
            if np.isnan(curve[epoch]):
                continue
            n_correct = round(curve[epoch] * samples_per_cell)
            ids += [pid] * samples_per_cell
            rewards += [1.0] * n_correct + [0.0] * (samples_per_cell - n_correct)
        record_samples(run_dir, epoch + 1, ids, rewards)


def test_score_run_computes_accuracy_backfills_drops_and_writes(tmp_path):
    curves = {
        "p0": [0.0, 0.5],
        "p1": [0.5, 0.5],
        "p2": [1.0, 0.5],
        "p3": [NAN, 0.5],  # back-filled from epoch 1: [0.5, 0.5]
        "p4": [0.5, NAN],  # incomplete: dropped
    }
    _record_run(tmp_path, curves)
    # A corrupt line and a step past the scored epochs are ignored.
    with open(tmp_path / "samples" / "step_1.jsonl", "a") as f:
        f.write("{not json\n")
    record_samples(tmp_path, 3, ["p0"] * 4, [1.0] * 4)
    result = score_run(tmp_path, steps_per_epoch=1, epochs=2)
    assert result.ids == ["p0", "p1", "p2", "p3"] and result.dropped == ["p4"]
    assert result.backfilled == 1
    np.testing.assert_allclose(result.accuracy[3], [0.5, 0.5])
    np.testing.assert_allclose(result.mean_curve, [0.5, 0.5])
    np.testing.assert_allclose(result.scores, [0.5, 1.0, 0.5, 1.0])
    saved = load_scores(tmp_path / limr.SCORES_FILE)
    assert saved.ids == result.ids
    np.testing.assert_allclose(saved.scores, result.scores)


def test_score_run_correct_reward_is_configurable_and_steps_map_to_epochs(tmp_path):
    # Two steps per epoch; reward 2.0 means correct.
    record_samples(tmp_path, 1, ["a", "b"], [2.0, 1.0])
    record_samples(tmp_path, 2, ["a", "b"], [0.0, 2.0])
    record_samples(tmp_path, 3, ["a", "b"], [2.0, 2.0])
    record_samples(tmp_path, 4, ["a"], [2.0])
    result = score_run(tmp_path, steps_per_epoch=2, epochs=2, correct_reward=2.0)
    np.testing.assert_allclose(result.accuracy, [[0.5, 1.0], [0.5, 1.0]])


def test_score_run_counts_a_reward_recorded_in_float32_as_correct(tmp_path):
    """The rollout stage records scores as float32 (`RolloutStage`), so a correct reward of 0.9
    is on disk as float32(0.9) = 0.8999999761581421: it is correct (reward >= correct, the
    rule of validation and eval); the float32 below it is not."""
    correct = np.float32(0.9)
    below = np.nextafter(correct, np.float32(0))
    for step in (1, 2):
        rewards = np.asarray([correct, correct, correct, below], np.float32)
        record_samples(tmp_path, step, ["a", "a", "b", "b"], rewards)
    assert json.loads((tmp_path / "samples" / "step_1.jsonl").open().readline())["reward"] != 0.9
    result = score_run(tmp_path, steps_per_epoch=1, epochs=2, correct_reward=0.9)
    np.testing.assert_array_equal(result.accuracy, [[1.0, 1.0], [0.5, 0.5]])


def test_score_run_warns_when_no_sample_counts_as_correct(tmp_path, caplog):
    for step in (1, 2):
        record_samples(tmp_path, step, ["a", "b"], [1.0, 0.0])
    with caplog.at_level("WARNING"):
        score_run(tmp_path, steps_per_epoch=1, epochs=2)
    assert "no sample" not in caplog.text
    with caplog.at_level("WARNING"):
        score_run(tmp_path, steps_per_epoch=1, epochs=2, correct_reward=1.5)
    assert "no sample of the 4 scored has reward 1.5 or more" in caplog.text


def _scored_run(tmp_path):
    run = tmp_path / "run"
    _record_run(run, {"q000": [0.0, 0.5], "q001": [0.5, 0.5], "q002": [1.0, 0.5]})
    return score_run(run, steps_per_epoch=1, epochs=2)  # scores 0.5, 1.0, 0.5 exactly


def test_select_threshold_is_inclusive_and_keeps_json_array_format(tmp_path, math_rows):
    scores = _scored_run(tmp_path)
    data = tmp_path / "math.json"
    data.write_text(json.dumps(math_rows(5), indent=4))
    out = tmp_path / "lim.json"
    assert select(scores, data, 0.5, out) == 3  # the two scores of exactly 0.5 are kept
    subset = json.loads(out.read_text())
    assert subset == math_rows(3)
    assert select(tmp_path / "run" / limr.SCORES_FILE, data, 0.6, out) == 1
    assert [row["id"] for row in json.loads(out.read_text())] == ["q001"]
    # what select would write, without writing: kept ids that are in the data file
    assert lim_subset_size(scores, data, 0.5) == 3 and lim_subset_size(scores, data, 0.6) == 1
    short = tmp_path / "short.json"
    short.write_text(json.dumps(math_rows(2)))  # q002, scored 0.5, is not in it
    assert lim_subset_size(scores, short, 0.5) == 2 == select(scores, short, 0.5, out)


def test_select_copies_jsonl_lines_verbatim(tmp_path, math_rows):
    scores = _scored_run(tmp_path)
    lines = [json.dumps(r, indent=None, separators=(",", ":")) for r in math_rows(4)]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "lim.jsonl"
    assert select(scores, data, 0.75, out) == 1
    assert out.read_text() == lines[1] + "\n"


def test_select_keeps_parquet_as_parquet(tmp_path, math_rows):
    scores = _scored_run(tmp_path)
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(math_rows(4)), data)
    out = tmp_path / "lim.parquet"
    assert select(scores, data, 0.5, out) == 3
    assert pq.read_table(out).to_pylist() == math_rows(3)


def test_select_refuses_arrow_data_naming_the_formats_it_writes(tmp_path, math_rows):
    import pyarrow.ipc as ipc

    scores = _scored_run(tmp_path)
    data = tmp_path / "train.arrow"
    table = pa.Table.from_pylist(math_rows(3))
    with ipc.new_file(str(data), table.schema) as writer:
        writer.write_table(table)
    out = tmp_path / "lim.arrow"
    with pytest.raises(ConfigError, match=r"writes jsonl, json or parquet: convert .*train\.arrow"):
        select(scores, data, 0.5, out)
    with pytest.raises(ConfigError, match=r"writes jsonl, json or parquet"):
        random_subset(data, 1, 0, out)
    assert not out.exists()


def test_random_subset_has_the_size_asked_and_is_deterministic(tmp_path, math_rows):
    data = tmp_path / "math.json"
    data.write_text(json.dumps(math_rows(50)))
    a, b, c = (tmp_path / f"{name}.json" for name in "abc")
    assert random_subset(data, 12, 3, a) == 12
    random_subset(data, 12, 3, b)
    random_subset(data, 12, 4, c)
    assert a.read_text() == b.read_text()
    assert a.read_text() != c.read_text()
    ids = [row["id"] for row in json.loads(a.read_text())]
    assert len(set(ids)) == 12 and ids == sorted(ids)  # file order kept
    assert random_ids(["x", "y"], 2, 0) == ["x", "y"]
    with pytest.raises(ValueError, match="cannot draw 3 of 2"):
        random_ids(["x", "y"], 3, 0)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxrl_llm.data.limr_plot import plot_lim_curves

    scores = _scored_run(tmp_path)
    out = plot_lim_curves(scores, tmp_path / "lim.png", threshold=0.6, n_examples=2)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _record_steps(run_dir, steps, ids=("p0", "p1")):
    """Steps 1..steps, each recording every prompt in ``ids`` once, half of them correct."""
    for step in range(1, steps + 1):
        record_samples(run_dir, step, list(ids), [float(i % 2) for i in range(len(ids))])


def test_score_run_refuses_records_that_stop_before_the_last_epoch(tmp_path):
    """The LIMR paper workflow's mismatch: 160 steps recorded, 21 epochs of 8 asked (168)."""
    _record_steps(tmp_path, 160)
    with pytest.raises(ConfigError) as e:
        score_run(tmp_path, steps_per_epoch=8, epochs=21)
    message = str(e.value)
    assert "\n" not in message
    assert "step_160.jsonl" in message and "step 168" in message
    assert "20 whole epochs" in message and "--epochs 20" in message
    assert not (tmp_path / limr.SCORES_FILE).exists()
    # a run that stopped inside the last epoch asked for is refused too (its last epoch would
    # miss the prompts of the steps never taken)
    with pytest.raises(ConfigError, match=r"step_160\.jsonl.*19 whole epochs"):
        score_run(tmp_path, steps_per_epoch=8, epochs=21, first_step=9)
    assert score_run(tmp_path, steps_per_epoch=8, epochs=20).ids == ["p0", "p1"]


def test_score_run_refuses_when_no_whole_epoch_was_recorded(tmp_path):
    _record_steps(tmp_path, 5)
    with pytest.raises(ConfigError, match=r"step_5\.jsonl.*no whole epoch"):
        score_run(tmp_path, steps_per_epoch=8, epochs=1)


def test_score_run_refuses_an_empty_result(tmp_path):
    """Every prompt misses an epoch that the next epoch cannot fill: nothing is scored."""
    for step, pid in enumerate(["a", "b", "c"], start=1):
        record_samples(tmp_path, step, [pid], [1.0])
    with pytest.raises(ConfigError, match="no prompt has samples in every one of the 3 epochs"):
        score_run(tmp_path, steps_per_epoch=1, epochs=3)
    assert not (tmp_path / limr.SCORES_FILE).exists()


@pytest.mark.parametrize(
    ("steps_per_epoch", "epochs", "match"),
    [(0, 3, "steps_per_epoch must be >= 1, got 0"), (1, 0, "epochs must be >= 1, got 0")],
)
def test_score_run_refuses_bad_counts(tmp_path, steps_per_epoch, epochs, match):
    _record_steps(tmp_path, 3)
    with pytest.raises(ConfigError, match=match):
        score_run(tmp_path, steps_per_epoch=steps_per_epoch, epochs=epochs)


def test_score_run_refuses_a_folder_without_records(tmp_path):
    with pytest.raises(ConfigError, match="no such folder; expected the directory of a"):
        score_run(tmp_path / "missing", steps_per_epoch=1, epochs=1)
    with pytest.raises(ConfigError, match="no samples/ folder in it"):
        score_run(tmp_path, steps_per_epoch=1, epochs=1)


def test_select_refuses_an_empty_subset_and_writes_nothing(tmp_path, math_rows):
    scores = _scored_run(tmp_path)  # q000..q002 scored 0.5, 1.0, 0.5
    data = tmp_path / "math.json"
    data.write_text(json.dumps(math_rows(5), indent=4))
    out = tmp_path / "lim.json"
    with pytest.raises(ConfigError, match=r"no prompt has LIM score >= 1\.5 \(the highest"):
        select(scores, data, 1.5, out)
    other = tmp_path / "other.jsonl"  # rows under other ids: nothing scored is in it
    other.write_text("".join(json.dumps({**r, "id": f"x{i}"}) + "\n"
                             for i, r in enumerate(math_rows(5))))  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"none of the 3 prompts .* is in .*other\.jsonl.*--id-key"
    ):
        select(scores, other, 0.5, out)
    assert not out.exists()


def test_random_subset_refuses_a_size_the_data_cannot_give(tmp_path, math_rows):
    data = tmp_path / "math.json"
    data.write_text(json.dumps(math_rows(5)))
    for n in (6, 0):
        with pytest.raises(ConfigError, match=rf"{n} prompts.*math\.json.*has 5.*1 to 5"):
            random_subset(data, n, 0, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_load_scores_refuses_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_scores(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a LIM scores file"):
        load_scores(tmp_path / "x.json")

"""`jaxrl-llm eval` end to end on the shipped tiny model."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from jaxrl_llm import cli


@pytest.mark.slow  # 30 s in a loaded 2-worker run, AMD EPYC AVX2
def test_eval_command_end_to_end_on_the_tiny_model(tmp_path, capsys):
    """With the python tool and room to use it the tiny model solves some samples (it was
    trained to call the tool), so pass@k and maj@k are checked on a mixed outcome."""
    out = tmp_path / "eval.json"
    argv = ["eval", "--checkpoint", "builtin", "--data", "builtin", "--limit", "4",
            "--max-new-tokens", "128", "--tool", "python", "--n", "2", "--temperature", "1.0",
            "--k", "1", "2", "--out", str(out)]  # fmt: skip
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
    # The formulas above bite: with the python tool the model solves some samples, not all
    # (pass@1 0.625, pass@2 1 on an Intel Xeon host), and some problems split their two.
    assert 0 < summary["pass@1"] < summary["pass@2"], summary
    assert any("```output" in t for r in rows for t in r["texts"]), "no tool call ran"
    # maj@1: the first sample's answer alone votes, so it wins exactly when it is right.
    assert summary["maj@1"] == pytest.approx(np.mean([r["correct"][0] for r in rows]))
    printed = capsys.readouterr().out
    assert "pass@2" in printed and "maj@2" in printed


def _math500_file(path):
    """Rows shaped as MATH-500 publishes them: problem, a worked solution, the final answer."""
    rows = [
        {"problem": f"What is {a} + {b}?", "solution": f"Add: {a} + {b} = \\boxed{{{a + b}}}.",
         "answer": str(a + b), "subject": "Prealgebra", "level": 1, "unique_id": f"t/{i}.json"}
        for i, (a, b) in enumerate([(1, 2), (3, 4), (10, 5)])
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow  # 34 s in a loaded 2-worker run, AMD EPYC AVX2
def test_eval_preset_reads_math500_fields_with_a_chosen_reward(tmp_path):
    """--preset math500 takes `problem` as the prompt, the short `answer` (not the worked
    solution) as ground truth and `unique_id` as id; --reward, --mesh and --dtype apply."""
    out = tmp_path / "eval.json"
    argv = ["eval", "--data", str(_math500_file(tmp_path / "math500.jsonl")), "--preset",
            "math500", "--reward", "exact_match", "--mesh", "1,1,2", "--dtype", "float32",
            "--max-new-tokens", "4", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["summary"]["reward"] == "exact_match"
    assert result["summary"]["dtype"] == "float32"
    rows = result["samples"]
    assert [r["id"] for r in rows] == ["t/0.json", "t/1.json", "t/2.json"]
    assert [r["answer"] for r in rows] == ["3", "7", "15"]


def test_eval_presets_know_aime_and_amc_field_names():
    from jaxrl_llm.data.examples import normalize_row
    from jaxrl_llm.rollout.evaluate import EVAL_PRESETS

    aime = {"ID": "2024-I-1", "Problem": "Find x.", "Solution": "long...", "Answer": 204}
    amc = {"id": 3, "question": "How many?", "answer": 27.0, "url": "https://..."}
    got_aime = normalize_row(aime, EVAL_PRESETS["aime24"].fields, default_id="x")
    got_amc = normalize_row(amc, EVAL_PRESETS["amc23"].fields, default_id="x")
    assert (got_aime["prompt"], str(got_aime["answer"])) == ("Find x.", "204")
    assert (got_amc["prompt"], str(got_amc["answer"])) == ("How many?", "27.0")


def test_majority_vote_is_scored_by_the_samples_that_gave_it():
    from jaxrl_llm.rollout.evaluate import _summary

    rows = [
        {"answers": ["4", "5", "4"], "correct": [True, False, True]},  # majority right
        {"answers": ["1", "1", "2"], "correct": [False, False, True]},  # majority wrong
        {"answers": [None, None, "3"], "correct": [False, False, False]},
    ]
    got = _summary(rows, n=3, ks=[1, 3])
    assert got["maj@3"] == pytest.approx(1 / 3)
    assert got["maj@1"] == pytest.approx(1 / 3)  # the first sample's own answer
    assert got["pass@1"] == pytest.approx(np.mean([2 / 3, 1 / 3, 0]))


def _math_rows(texts: list[str], truth: str) -> list[dict]:
    """One eval row scored as `eval --reward math` does (RewardConfig defaults)."""
    from jaxrl_llm.rewards import extract_answer, math_reward
    from jaxrl_llm.rewards.config import RewardConfig

    correct = RewardConfig().correct
    scores = [math_reward(t, truth, correct=correct, incorrect=0.0) for t in texts]
    return [{"answers": [extract_answer(t) for t in texts],
             "correct": [s >= correct for s in scores]}]  # fmt: skip


def test_majority_vote_counts_spellings_of_one_answer_together():
    """0.5, \\frac{1}{2} and 1/2 are one answer (three votes) against 3 (two): maj@5 is 1.
    Counted as raw strings, 3 won and maj@5 was 0."""
    from jaxrl_llm.rollout.evaluate import _summary

    texts = ["so \\boxed{0.5}", "so \\boxed{\\frac{1}{2}}", "so \\boxed{3}", "so \\boxed{3}",
             "so \\boxed{1/2}"]  # fmt: skip
    rows = _math_rows(texts, "\\frac{1}{2}")
    assert rows[0]["correct"] == [True, True, False, False, True]
    assert _summary(rows, n=5, ks=[5])["maj@5"] == 1.0


def test_majority_vote_merges_spellings_of_one_wrong_answer():
    """7, 7.0 and \\frac{14}{2} are one wrong answer (three votes) against the truth 12 (two):
    maj@5 is 0. Counted as raw strings, 12 led and maj@5 was 1."""
    from jaxrl_llm.rollout.evaluate import _summary

    texts = ["\\boxed{12}", "\\boxed{7}", "\\boxed{7.0}", "\\boxed{\\frac{14}{2}}", "\\boxed{12}"]
    assert _summary(_math_rows(texts, "12"), n=5, ks=[5])["maj@5"] == 0.0


def _scored_rollout(texts: list[str], truth: str, scores) -> SimpleNamespace:
    """The fields of a scored `Rollout` that `evaluate._rows` reads: one prompt, its samples."""
    return SimpleNamespace(
        group_size=len(texts), prompt_ids=["p0"], answers=[truth] * len(texts),
        completions=[SimpleNamespace(text=t) for t in texts], scores=np.asarray(scores),
    )  # fmt: skip


def test_eval_counts_a_sample_solved_as_validation_does():
    """Solved means score >= RewardConfig.correct, in eval as in `val/test_score`. With
    weights {math: 1.0, format: 0.1} a wrong but boxed answer scores 0.1, which eval (score
    > 0) counted solved; so did a right answer after a failed cell under ToRL's -0.5 penalty
    (1.0 - 0.5 = 0.5), which validation counts unsolved."""
    import gin

    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.rewards.config import RewardConfig, build_reward_pool
    from jaxrl_llm.rewards.verifiable import math_reward
    from jaxrl_llm.rollout.evaluate import _rows

    texts = ["so the answer is \\boxed{7}", "so the answer is \\boxed{8}", "I don't know"]
    parse_gin([], ['RewardConfig.weights = {"math": 1.0, "format": 0.1}'])
    try:
        cfg = RewardConfig(name="math", workers=1)
        pool = build_reward_pool(cfg)
        try:
            scores = pool.score(texts, [{"prompt": "3+4?", "answer": "7", "id": 0}] * 3)
        finally:
            pool.close()
    finally:
        gin.clear_config()
    # The bug's premise: math + format (the pool's weighted sum, the same float64 additions).
    np.testing.assert_array_equal(scores, [1.0 * 1.0 + 0.1 * 1.0, 0.1 * 1.0, 0.0])
    assert _rows(_scored_rollout(texts, "7", scores), cfg.correct)[0]["correct"] == [
        True, False, False,
    ]  # fmt: skip
    failed_cell = "```output\nZeroDivisionError: division by zero\n```\nSo \\boxed{7}"
    torl = math_reward(failed_cell, "7", correct=1.0, incorrect=-1.0, code_failure_penalty=-0.5)
    assert torl == 0.5
    row = _rows(_scored_rollout([failed_cell], "7", [torl]), correct=1.0)[0]
    assert row["correct"] == [False]


def test_eval_flag_errors_name_the_flag():
    from jaxrl_llm.rollout.loading import parse_mesh, resolve_dtype

    with pytest.raises(ValueError, match="--mesh must be DATA,FSDP,TENSOR"):
        parse_mesh("8")
    assert parse_mesh("1,2,-1") == (1, 2, -1)
    assert resolve_dtype("auto", backend="cpu") == "float32"
    assert resolve_dtype("auto", backend="tpu") == "bfloat16"
    assert resolve_dtype("auto", backend="gpu") == "bfloat16"
    with pytest.raises(SystemExit):  # argparse names the flag and the choices
        cli.main(["eval", "--preset", "gsm8k"])
    assert cli.main(["eval", "--preset", "math500"]) == 2  # a configuration error, one line


def test_sampling_model_is_loaded_into_its_shards():
    """--mesh 1,1,4: each attention and MLP weight arrives split over the 4 tensor devices
    (no device holds it whole); --dtype auto is float32 on CPU."""
    import argparse

    from jaxrl_llm.rollout.loading import add_model_arguments, load_sampling_model

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    loaded = load_sampling_model(parser.parse_args(["--mesh", "1,1,4"]))
    assert dict(loaded.mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 4}
    attn = loaded.model.model.layers[0].self_attn
    q, up = attn.q_proj[...], loaded.model.model.layers[0].mlp.up_proj[...]
    assert q.dtype == np.float32 and loaded.dtype == "float32"
    for w, split_axis in ((q, 1), (up, 1)):
        shard = w.addressable_shards[0].data
        assert len(w.addressable_shards) == 4
        assert shard.shape[split_axis] * 4 == w.shape[split_axis]


@pytest.mark.slow  # 38 s in a loaded 2-worker run, AMD EPYC AVX2
def test_eval_takes_gin_settings_such_as_the_sandbox_backend(capsys):
    """Settings without a flag come through --gin_param (here the explicit opt-in to the
    subprocess sandbox, the only way to run the Python tool where bubblewrap is missing);
    a wrong value is refused by name."""
    import gin

    from jaxrl_llm.tools.sandbox_types import SandboxConfig

    base = ["eval", "--checkpoint", "builtin", "--data", "builtin", "--limit", "2",
            "--max-new-tokens", "8", "--tool", "python"]  # fmt: skip
    try:
        assert cli.main([*base, "--gin_param", 'SandboxConfig.backend="subprocess"']) == 0
        assert SandboxConfig().backend == "subprocess"
        assert cli.main([*base, "--gin_param", 'SandboxConfig.backend="nope"']) == 2
        assert "SandboxConfig.backend" in capsys.readouterr().err
    finally:
        gin.clear_config()


def test_a_score_recorded_in_float32_at_correct_is_solved():
    """Scores are recorded in float32 (the rollout's), so RewardConfig.correct = 0.9 is met by
    float32(0.9) = 0.8999999761..., which a float64 comparison counted unsolved; the next
    float32 below it is not."""
    from jaxrl_llm.rewards.config import solved

    at = np.float32(0.9)
    scores = np.asarray([at, np.nextafter(at, np.float32(0)), 1.0], np.float32)
    assert solved(scores, 0.9).tolist() == [True, False, True]

"""A reproduction's summary (metrics, intervals, comparisons), tables and figure, from
hand-made curves (no training)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.repro import report
from jaxrl_llm.repro.runner import RunCurve, curve_of, resummarise, seed_params, summarise
from jaxrl_llm.repro.specs import Arm, Prepared, Repro, get_repro, seed_list

REPRO = Repro(
    name="toy",
    claim="a beats b",
    arms=(Arm("a", ("x.gin",), "arm a"), Arm("b", ("x.gin",), "arm b")),
    comparisons=(("a", "b"),),
)


def _curve(arm, seed, scores):
    return RunCurve(arm, seed, (0, 2, 4), tuple(scores), (0.5, 0.6), 10.0, f"runs/{arm}{seed}")


def _curves():
    a = [(0.4, 0.6, 0.8), (0.4, 0.7, 0.9), (0.4, 0.5, 0.7)]
    b = [(0.4, 0.5, 0.6), (0.4, 0.5, 0.7), (0.4, 0.5, 0.7)]
    return [_curve("a", s, v) for s, v in enumerate(a)] + [
        _curve("b", s, v) for s, v in enumerate(b)
    ]


def test_metrics_final_and_mean_after_step_zero():
    c = _curve("a", 0, (0.4, 0.6, 0.8))
    np.testing.assert_allclose(
        [c.metric("final"), c.metric("mean"), c.metric("gain")], [0.8, 0.7, 0.4], atol=1e-12
    )
    with pytest.raises(ValueError, match="metric 'best' is not one of"):
        c.metric("best")
    with pytest.raises(ValueError, match="recorded no val/test_score after step 0"):
        RunCurve("a", 0, (0,), (0.4,), (), 1.0, "runs/x").metric("final")
    with pytest.raises(ValueError, match="has no step-0 val/test_score to gain from"):
        RunCurve("a", 0, (2,), (0.4,), (), 1.0, "runs/x").metric("gain")


def test_summary_pairs_arms_by_seed():
    result = summarise(REPRO, _curves(), Prepared(notes={"k": 1}), steps=4)
    assert result["seeds"] == [0, 1, 2] and result["prepared"] == {"k": 1}
    np.testing.assert_allclose(result["arms"]["a"]["final_val"]["mean"], 0.8, atol=1e-12)
    np.testing.assert_allclose(result["arms"]["b"]["mean_val"]["mean"], 0.5833333333, atol=1e-9)
    final = next(c for c in result["comparisons"] if c["metric"] == "final")
    # differences 0.2, 0.2, 0.0: mean 0.1333; sign flips reaching |mean| >= 0.1333: 4 of 8
    np.testing.assert_allclose(final["difference"]["mean"], 0.4 / 3, atol=1e-12)
    np.testing.assert_allclose(final["p_value"], 0.5, atol=1e-12)
    assert final["significant"] is False


def test_resummarise_round_trips_through_json():
    result = summarise(REPRO, _curves(), Prepared(notes={"k": 1}), steps=4)
    again = resummarise(REPRO, json.loads(json.dumps({**result, "timing": {"total_s": 3}})))
    assert again["timing"] == {"total_s": 3}
    assert json.dumps({**again, "timing": None}) == json.dumps({**result, "timing": None})


def test_summary_refuses_unpaired_seeds():
    with pytest.raises(ValueError, match="arms ran different seeds"):
        summarise(REPRO, _curves()[:-1], Prepared(), steps=4)


def test_tables_and_figure(tmp_path):
    result = summarise(REPRO, _curves(), Prepared(), steps=4)
    text = report.markdown_tables(result)
    assert "| a | arm a | 80.0% [" in text
    assert "| a - b | final | 13.3 [" in text and "| 0.500 (0.250) |" in text
    one_seed = summarise(REPRO, [_curves()[0], _curves()[3]], Prepared(), steps=4)
    assert "(one seed: no interval)" in report.markdown_tables(one_seed)
    path = report.plot_result(result, tmp_path / "fig.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_curve_of_reads_records():
    records = [
        {"step": 0, "val/test_score": 0.25},
        {"step": 1, "critic/score/mean": 0.5},
        {"step": 2, "critic/score/mean": 0.75, "val/test_score": 0.5},
    ]
    c = curve_of("a", 3, records, 12.34, Path("runs/r"))
    assert (c.val_steps, c.val_scores, c.train_scores) == ((0, 2), (0.25, 0.5), (0.5, 0.75))
    assert c.wall_s == 12.3 and c.run_dir == "runs/r"


def test_registry_and_flags():
    assert [a.name for a in get_repro("limr").arms] == ["full", "lim", "random"]
    assert seed_params(2, 5) == [
        "RLConfig.seed = 2",
        "DataConfig.seed = 2",
        "RLConfig.save_every = 0",
        "RLConfig.steps = 5",
    ]
    with pytest.raises(ValueError, match="unknown reproduction 'r1'; choose from"):
        get_repro("r1")
    with pytest.raises(ValueError, match="--seeds = 0: expected an integer >= 1"):
        seed_list(0)
    with pytest.raises(ValueError, match="toy has no arm 'c'"):
        REPRO.arm("c")


def test_report_only_redraws_from_results(tmp_path, capsys):
    from jaxrl_llm import cli

    repro = get_repro("search-r1")
    curves = [
        RunCurve(arm, s, (0, 5), (0.1, 0.1 * (s + 1) + (0.2 if arm == "search" else 0)), (), 1, "r")
        for s in range(3)
        for arm in ("search", "no_search", "search_unmasked")
    ]
    result = summarise(repro, curves, Prepared(), steps=5)
    (tmp_path / "results.json").write_text(json.dumps(result))
    assert cli.main(["repro", "search-r1", "--out", str(tmp_path), "--report-only"]) == 0
    assert "| search - no_search | gain | 20.0 [20.0, 20.0]" in capsys.readouterr().out
    assert (tmp_path / "figure.png").is_file() and (tmp_path / "summary.md").is_file()
    assert cli.main(["repro", "search-r1", "--out", str(tmp_path / "none"), "--report-only"]) == 2
    assert re.search(r"needs .*results\.json from an earlier run", capsys.readouterr().err)


def test_extra_gin_params_reach_every_run_last(tmp_path, monkeypatch):
    from jaxrl_llm.repro import runner

    seen = []

    def fake_train_run(gin_files, params, run_dir):
        seen.append(list(params))
        return [{"step": 0, "val/test_score": 0.5}, {"step": 1, "val/test_score": 0.75}]

    monkeypatch.setattr(runner, "train_run", fake_train_run)
    toy = Repro("toy", "a beats b", (Arm("a", ("grpo_tiny.gin",), "a"),
                                     Arm("b", ("grpo_tiny.gin",), "b")), (("a", "b"),))  # fmt: skip
    extra = ["RolloutConfig.n = 8", "RLConfig.steps = 3"]
    result = runner.run_repro(toy, seeds=[0, 1], steps=1, out_dir=tmp_path, gin_params=extra)
    assert len(seen) == 4 and all(p[-2:] == extra for p in seen)  # after steps = 1: they win
    assert result["gin_params"] == extra
    saved = json.loads((tmp_path / "results.json").read_text())
    assert resummarise(toy, saved)["gin_params"] == extra
    assert "every run with `RolloutConfig.n = 8`;" in report.markdown_tables(result)


def test_a_bad_extra_gin_param_stops_before_any_training(tmp_path, monkeypatch, capsys):
    from jaxrl_llm import cli
    from jaxrl_llm.repro import runner

    def no_training(*_):
        raise AssertionError("nothing may train with a bad binding")

    monkeypatch.setattr(runner, "train_run", no_training)
    runner.check_gin_params(get_repro("search-r1"), ["RolloutConfig.n = 8"])  # fine for each arm
    out = tmp_path / "bad"
    argv = ["repro", "search-r1", "--gin_param", "RolloutConfig.nn = 8", "--out", str(out)]
    assert cli.main(argv) == 2
    assert "doesn't have a parameter named 'nn'" in capsys.readouterr().err
    assert not out.exists()
    argv[3] = "RolloutConfig.n = 0"
    assert cli.main(argv) == 2
    assert "RolloutConfig.n = 0: expected int (>= 1)" in capsys.readouterr().err

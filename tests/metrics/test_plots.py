"""`write_dashboard` / `jaxrl-llm plot` from metrics files with known values."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from jaxrl_llm import cli
from jaxrl_llm.metrics.plots import build_figures, load_series, write_dashboard
from tests.metrics.synthetic_runs import STEPS, grpo_record, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GRPO_GROUPS = {"reward", "length", "policy", "clip", "timing"}  # no critic, no tools


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def test_load_series_drops_non_finite_and_keeps_eval_steps(grpo_run):
    series = load_series(grpo_run)
    steps, values = series["val/test_score"]
    np.testing.assert_array_equal(steps, [0, 10, 20, 30])
    np.testing.assert_allclose(values, [0.1, 0.3, 0.5, 0.7], atol=1e-12)
    steps, _ = series["actor/pg_loss"]
    assert 5 not in steps and len(steps) == STEPS - 1  # the "nan" record is dropped


@pytest.mark.slow  # 9 s in a loaded 2-worker run, AMD EPYC AVX2
def test_dashboard_files_are_pngs_and_absent_groups_are_skipped(grpo_run, tmp_path):
    out = tmp_path / "plots"
    paths = write_dashboard([grpo_run], out)
    names = {p.name for p in paths}
    assert paths[0].name == "dashboard.png"
    assert names == {"dashboard.png"} | {f"dashboard_{g}.png" for g in GRPO_GROUPS}
    assert not (out / "dashboard_critic.png").exists()
    assert not (out / "dashboard_tools.png").exists()
    for p in paths:
        w, h = png_size(p)
        assert w >= 400 and h >= 300 and p.stat().st_size > 10_000, (p, w, h)
    w, h = png_size(out / "dashboard.png")
    assert h > 4 * 300  # one row per present group (5 here)
    assert not list(out.glob(".*.tmp"))


def test_panels_hold_the_known_values_and_val_uses_markers(grpo_run):
    figs = build_figures([grpo_run])
    assert set(figs) == {"dashboard"} | GRPO_GROUPS
    (ax,) = figs["reward"].axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"train score", "val test score"}  # val/reward/mean absent: no line
    val = lines["val test score"]
    np.testing.assert_array_equal(val.get_xdata(), [0, 10, 20, 30])
    assert val.get_marker() == "o"
    train = lines["train score"]
    np.testing.assert_allclose(train.get_ydata()[-1], grpo_record(STEPS)["critic/score/mean"])
    # Panels within a group: response length's clip ratio is drawn, the policy row has 3.
    assert [a.get_title() for a in figs["policy"].axes] == ["pg_loss", "KL", "entropy"]
    assert len(figs["length"].axes) == 2


def test_two_runs_overlay_with_run_names(grpo_run, tmp_path):
    other = write_run(
        tmp_path / "ppo_run",
        [grpo_record(s, offset=0.1) | {"critic/vf_loss": 1.0 / s} for s in range(1, 11)],
    )
    figs = build_figures([grpo_run, other])
    assert "critic" in figs  # present in one run is enough
    (ax,) = figs["reward"].axes
    labels = {line.get_label() for line in ax.get_lines()}
    assert {"grpo_run: train score", "ppo_run: train score", "grpo_run: val test score"} <= labels
    (entropy_ax,) = [a for a in figs["policy"].axes if a.get_title() == "entropy"]
    assert [t.get_text() for t in entropy_ax.get_legend().get_texts()] == ["grpo_run", "ppo_run"]
    colors = {line.get_label(): line.get_color() for line in entropy_ax.get_lines()}
    assert colors["grpo_run"] != colors["ppo_run"]


@pytest.mark.slow  # 11 s in a loaded 2-worker run, AMD EPYC AVX2
def test_plot_command_defaults_to_first_run_dir(grpo_run, tmp_path, capsys):
    other = write_run(tmp_path / "second", [grpo_record(s) for s in range(1, 4)])
    assert cli.main(["plot", str(grpo_run), str(other)]) == 0
    assert (grpo_run / "dashboard.png").exists() and not (other / "dashboard.png").exists()
    assert "dashboard.png" in capsys.readouterr().out


def test_plot_without_plottable_metrics_writes_nothing(tmp_path):
    run = write_run(tmp_path / "empty", [{"step": 1, "actor/pg_loss": "nan"}])
    assert write_dashboard([run], tmp_path / "out") == []
    with pytest.raises(FileNotFoundError):
        write_dashboard([tmp_path / "missing"], tmp_path / "out")


def test_plot_command_given_a_metrics_file_writes_next_to_it(tmp_path, capsys):
    run = write_run(tmp_path / "run", [{"step": s, "critic/score/mean": 0.1 * s} for s in (1, 2)])
    assert cli.main(["plot", str(run / "metrics.jsonl")]) == 0
    assert (run / "dashboard.png").exists() and (run / "dashboard_reward.png").exists()
    assert str(run / "dashboard.png") in capsys.readouterr().out
    other = write_run(tmp_path / "other", [{"step": 1, "critic/score/mean": 0.3}])
    (ax,) = build_figures([run / "metrics.jsonl", other])["reward"].axes  # labelled by folder
    assert {line.get_label() for line in ax.get_lines()} == {"run", "other"}


def test_a_line_that_is_not_a_json_object_is_skipped(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    lines = ['{"step": 1, "critic/score/mean": 0.5}', "null", "[2, 3]", "7", '{"step": 2, "x": 1}']
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    series = load_series(run)
    assert {k: (s.tolist(), v.tolist()) for k, (s, v) in series.items()} == {
        "critic/score/mean": ([1], [0.5]), "x": ([2], [1.0]),
    }  # fmt: skip
    assert "skipped line(s) [2, 3, 4]: not JSON objects" in caplog.text
    assert "metrics.jsonl" in caplog.text

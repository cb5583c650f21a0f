"""`jaxrl-llm plot` labels: every run keeps its own line when run folders share names."""

from __future__ import annotations

from etils import epath

from jaxrl_llm.metrics.plots import build_figures, run_labels
from tests.metrics.synthetic_runs import grpo_record, write_run


def runs(tmp_path, *folders):
    return [
        write_run(tmp_path / f, [grpo_record(s, offset=0.1 * i) for s in range(1, 4)])
        for i, f in enumerate(folders)
    ]


def test_runs_with_the_same_parent_and_name_both_draw(tmp_path):
    first, second = runs(tmp_path, "x/a/run", "y/a/run")
    assert run_labels([epath.Path(first), epath.Path(second)]) == ["x/a/run", "y/a/run"]
    (ax,) = [a for a in build_figures([first, second])["policy"].axes if a.get_title() == "entropy"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["x/a/run", "y/a/run"]
    ends = [line.get_ydata()[-1] for line in ax.get_lines()]
    assert ends == [grpo_record(3)["actor/entropy"]] * 2  # both runs' data, one line each


def test_labels_widen_only_where_names_collide(tmp_path):
    paths = [epath.Path(p) for p in runs(tmp_path, "x/a/run", "y/a/run", "z/b/run", "other")]
    assert run_labels(paths) == ["x/a/run", "y/a/run", "b/run", "other"]


def test_a_run_given_twice_keeps_both_lines(tmp_path):
    (run,) = runs(tmp_path, "a/run")
    labels = run_labels([epath.Path(run), epath.Path(run)])
    assert len(set(labels)) == 2 and all(str(run.resolve()) in label for label in labels)


def test_cloud_paths_widen_too():
    paths = [epath.Path("gs://b/x/a/run"), epath.Path("gs://b/y/a/run")]
    assert run_labels(paths) == ["x/a/run", "y/a/run"]

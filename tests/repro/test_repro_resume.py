"""A reproduction that crashes continues where it stopped: finished runs are reused (same arm,
seed and resolved gin config), a run killed midway trains again in a fresh folder, and
``results.json`` holds the complete seed pairs after each seed. Training is faked (as
tests/repro/test_report.py does); the gin files are parsed for real."""

import json
from pathlib import Path

import gin
import pytest

from jaxrl_llm.repro import runner
from jaxrl_llm.repro.specs import Arm, Repro

SEEDS = range(5)


@pytest.fixture(autouse=True)
def _no_bindings_left():
    yield
    gin.clear_config()


def _toy(gin_b: str = "grpo_tiny.gin") -> Repro:
    arms = (Arm("a", ("grpo_tiny.gin",), "arm a"), Arm("b", (gin_b,), "arm b"))
    return Repro("toy", "a beats b", arms, (("a", "b"),))


class FakeTraining:
    """Stands in for `runner.train_run`: writes a metrics file as a run does, returns its
    records (deterministic in arm and seed); `crash_at` (1-based) dies during that run after
    writing half its records, as a killed run leaves its folder."""

    def __init__(self, crash_at: int | None = None):
        self.crash_at = crash_at
        self.trained: list[str] = []
        self.dirty: list[str] = []  # runs that started in a folder an earlier run left

    def __call__(self, gin_files, params, run_dir: Path) -> list[dict]:
        self.trained.append(run_dir.name)
        if run_dir.exists():
            self.dirty.append(run_dir.name)
        run_dir.mkdir(parents=True, exist_ok=True)
        seed = int(next(p for p in params if p.startswith("RLConfig.seed")).split("=")[1])
        bonus = 0.05 if run_dir.name.startswith("a") else 0.0
        records = [
            {"step": 0, "val/test_score": 0.1, "critic/score/mean": 0.2},
            {"step": 2, "val/test_score": 0.2 + 0.01 * seed + bonus, "critic/score/mean": 0.3},
        ]
        with (run_dir / "metrics.jsonl").open("w") as f:
            f.write(json.dumps(records[0]) + "\n")
            if len(self.trained) == self.crash_at:
                raise RuntimeError("preempted")
            f.write(json.dumps(records[1]) + "\n")
        return records


def _run(out: Path, fake: FakeTraining, monkeypatch, repro: Repro | None = None, **kw):
    monkeypatch.setattr(runner, "train_run", fake)
    return runner.run_repro(repro or _toy(), seeds=SEEDS, steps=2, out_dir=out, **kw)


def _without_timing(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "timing"}


def test_a_crashed_repro_trains_only_its_missing_runs_and_ends_as_an_uninterrupted_one(
    tmp_path, monkeypatch
):
    out = tmp_path / "repro"
    clean = _run(out, FakeTraining(), monkeypatch)
    for path in sorted(out.rglob("*"), reverse=True):  # the same folder, emptied
        path.unlink() if path.is_file() else path.rmdir()

    crashing = FakeTraining(crash_at=6)  # seeds 0, 1 and arm a of seed 2 finish
    with pytest.raises(RuntimeError, match="preempted"):
        _run(out, crashing, monkeypatch)
    partial = json.loads((out / "results.json").read_text())
    assert partial["seeds"] == [0, 1]
    assert partial["partial"]["seeds_planned"] == list(SEEDS)
    assert runner.resummarise(_toy(), partial)["seeds"] == [0, 1]  # --report-only reads it

    rerun = FakeTraining()
    result = _run(out, rerun, monkeypatch)
    assert rerun.trained == ["b-seed2", "a-seed3", "b-seed3", "a-seed4", "b-seed4"]
    assert rerun.dirty == []  # b-seed2, killed midway, starts in a fresh folder
    assert _without_timing(result) == _without_timing(clean)
    saved = json.loads((out / "results.json").read_text())
    assert _without_timing(saved) == json.loads(json.dumps(_without_timing(clean)))
    assert saved["timing"]["reused_runs"] == 5


def test_a_changed_gin_config_retrains_only_the_runs_it_changes(tmp_path, monkeypatch):
    out = tmp_path / "repro"
    arm_b = tmp_path / "b.gin"
    arm_b.write_text("include 'grpo_tiny.gin'\nRolloutConfig.n = 4\n")
    _run(out, FakeTraining(), monkeypatch, _toy(str(arm_b)))

    again = FakeTraining()
    _run(out, again, monkeypatch, _toy(str(arm_b)))
    assert again.trained == []  # nothing changed: every run reused

    arm_b.write_text("include 'grpo_tiny.gin'\nRolloutConfig.n = 8\n")  # arm b's config changes
    changed = FakeTraining()
    _run(out, changed, monkeypatch, _toy(str(arm_b)))
    assert changed.trained == [f"b-seed{s}" for s in SEEDS]
    assert changed.dirty == []  # the other config's runs are not trained over

    prep = FakeTraining()  # --prep-steps changes what the preparation's outputs hold
    _run(out, prep, monkeypatch, _toy(str(arm_b)), prep_steps=3)
    assert len(prep.trained) == 2 * len(SEEDS)

    extra = FakeTraining()  # a --gin_param changes every run
    _run(out, extra, monkeypatch, _toy(str(arm_b)), gin_params=["RolloutConfig.n = 2"])
    assert len(extra.trained) == 2 * len(SEEDS)


def test_a_half_written_run_is_trained_again_in_a_fresh_folder(tmp_path, monkeypatch):
    out = tmp_path / "repro"
    with pytest.raises(RuntimeError, match="preempted"):
        _run(out, FakeTraining(crash_at=1), monkeypatch)
    assert (out / "runs" / "a-seed0" / "metrics.jsonl").is_file()  # half of its records
    assert not (out / "results.json").exists()  # no seed pair finished

    rerun = FakeTraining()
    result = _run(out, rerun, monkeypatch)
    assert rerun.trained[0] == "a-seed0" and len(rerun.trained) == 2 * len(SEEDS)
    assert rerun.dirty == []
    (first,) = [r for r in result["arms"]["a"]["runs"] if r["seed"] == 0]
    assert list(first["val_steps"]) == [0, 2]  # its records, not the killed run's half


def test_a_partial_result_says_so_in_its_tables(tmp_path, monkeypatch):
    from jaxrl_llm.repro import report

    out = tmp_path / "repro"
    with pytest.raises(RuntimeError, match="preempted"):
        _run(out, FakeTraining(crash_at=3), monkeypatch)
    partial = runner.resummarise(_toy(), json.loads((out / "results.json").read_text()))
    assert "**Partial**: seeds [0] of [0, 1, 2, 3, 4] finished" in report.markdown_tables(partial)

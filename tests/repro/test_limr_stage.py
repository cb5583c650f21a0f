"""LIMR's preparation on recorded rewards written by a stand-in for the scoring run (no
training): scores, threshold, the subsets and their composition."""

import json
from pathlib import Path

import numpy as np

from jaxrl_llm.data import limr
from jaxrl_llm.repro import limr_stage
from jaxrl_llm.repro.specs import PrepOptions

# Fraction of a prompt's 8 samples rewarded in epochs 1-4, per kind.
CURVES = {"easy": (0.5, 1.0, 1.0, 1.0), "hard": (0.25, 0.5, 0.75, 1.0), "noisy": (0.0,) * 4}


def _fake_scoring_run(calls):
    def run(gin_files, params, run_dir):
        calls.append(run_dir)
        train = next(p.split("'")[1] for p in params if p.startswith("TRAIN"))
        rows = [json.loads(line) for line in Path(train).read_text().splitlines()]
        per_step = limr_stage.PROMPTS_PER_STEP
        step = 1
        for epoch in range(limr_stage.EPOCHS):
            for i in range(0, len(rows), per_step):
                ids, rewards = [], []
                for row in rows[i : i + per_step]:
                    right = round(8 * CURVES[row["item_kind"]][epoch])
                    ids += [row["id"]] * 8
                    rewards += [1.0] * right + [0.0] * (8 - right)
                limr.record_samples(run_dir, step, ids, rewards)
                step += 1
        return []

    return run


def test_selection_on_known_curves(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(limr_stage, "train_run", _fake_scoring_run(calls))
    prepared = limr_stage.prepare_limr(PrepOptions(tmp_path, (0, 1)))
    notes = prepared.notes
    # Mean curve m = (16 e + 20 h) / 48 = [0.271, 0.542, 0.646, 0.75]. Scores
    # 1 - sum (r - m)^2 / sum (1 - m)^2: hard 0.919, easy 0.516, noisy -0.449; at 0.6 only the
    # 20 hard prompts stay.
    np.testing.assert_allclose(
        [notes["mean_lim_score_by_kind"][k] for k in ("easy", "hard", "noisy")],
        [0.516, 0.919, -0.449],
        atol=2e-3,
    )
    assert notes["lim_subset"] == {"easy": 0, "hard": 20, "noisy": 0}
    assert notes["scoring_epochs"] == 4 and notes["steps_per_epoch"] == 6
    for seed in ("0", "1"):
        assert sum(notes["random_subsets"][seed].values()) == 20
    lim_file = prepared.params("lim", 0)[0]
    assert "lim.jsonl" in lim_file and prepared.params("lim", 0)[1].startswith("VAL = ")
    assert "random-seed1.jsonl" in prepared.params("random", 1)[1]
    assert (tmp_path / "lim_curves.png").is_file()
    # A second call finds the finished scoring run and does not train again.
    limr_stage.prepare_limr(PrepOptions(tmp_path, (0,)))
    assert len(calls) == 1


def test_the_callers_bindings_reach_the_scoring_run_under_its_own(tmp_path, monkeypatch):
    calls, seen = [], []
    fake = _fake_scoring_run(calls)

    def run(gin_files, params, run_dir):
        seen.append(list(params))
        return fake(gin_files, params, run_dir)

    monkeypatch.setattr(limr_stage, "train_run", run)
    user = ("MeshConfig.devices = 1", "RLConfig.steps = 2")
    limr_stage.prepare_limr(PrepOptions(tmp_path, (0,), gin_params=user))
    # The caller's bindings first; the run's own step count after them wins.
    assert seen[0][:2] == list(user) and seen[0][-3] == "RLConfig.steps = 24"
    limr_stage.prepare_limr(PrepOptions(tmp_path, (0,), gin_params=user))
    assert len(calls) == 1  # the same bindings: the finished run is reused
    # Other bindings: the run trained from them is not taken for this one.
    limr_stage.prepare_limr(PrepOptions(tmp_path, (0,), gin_params=("MeshConfig.devices = 2",)))
    assert len(calls) == 2 and seen[1][0] == "MeshConfig.devices = 2"

"""`jaxrl-llm repro limr | search-r1` end to end at toy size: every arm, one seed, two steps."""

import json

import gin
import pytest

from jaxrl_llm import cli
from jaxrl_llm.data.tasks import mixed_value
from jaxrl_llm.repro.limr_stage import COUNTS


@pytest.fixture(autouse=True)
def _no_bindings_left():
    """A reproduction parses its arms' gin files in this process; their bindings (e.g.
    search_r1_tiny.gin's `RewardConfig.name`) must not reach later tests' configs."""
    yield
    gin.clear_config()


def test_unknown_reproduction_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["repro", "r1"])
    assert exc.value.code == 2
    assert "invalid choice: 'r1'" in capsys.readouterr().err


@pytest.mark.slow  # measured: 118-145 s on 2 shared cores (6-step scoring run + 3 two-step arms)
def test_limr_smoke_runs_every_arm(tmp_path, capsys):
    out = tmp_path / "limr"
    code = cli.main(
        ["repro", "limr", "--seeds", "1", "--steps", "2", "--prep-steps", "6", "--out", str(out)]
    )
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    assert sorted(result["arms"]) == ["full", "lim", "random"]
    for arm in result["arms"].values():
        (run,) = arm["runs"]
        assert run["seed"] == 0 and run["val_steps"] == [0, 2] and len(run["train_scores"]) == 2
        assert 0.0 <= run["val_scores"][-1] <= 1.0
    notes = result["prepared"]
    assert notes["full_set"] == COUNTS and notes["scoring_epochs"] == 1
    kept = sum(notes["lim_subset"].values())
    assert 1 <= kept <= sum(COUNTS.values())
    assert sum(notes["random_subsets"]["0"].values()) == kept
    assert set(notes["mean_lim_score_by_kind"]) == set(mixed_value.ITEM_KINDS)
    assert len(result["comparisons"]) == 9  # 3 pairs x (final, mean, gain)
    assert (out / "figure.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "lim_curves.png").is_file()
    assert "| lim - random | final |" in (out / "summary.md").read_text()
    assert '"out"' in capsys.readouterr().out


@pytest.mark.slow  # measured: 88 s on 2 cores (a 2-step SFT stage and 3 arms x 2 RL steps)
def test_search_r1_smoke_runs_every_arm(tmp_path):
    out = tmp_path / "search"
    code = cli.main(
        ["repro", "search-r1", "--seeds", "1", "--steps", "2", "--prep-steps", "2",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    assert sorted(result["arms"]) == ["no_search", "search", "search_unmasked"]
    for arm in result["arms"].values():
        (run,) = arm["runs"]
        assert run["seed"] == 0 and run["val_steps"][-1] == 2 and len(run["train_scores"]) == 2
    assert result["prepared"]["sft_val_loss"] > 0
    assert len(result["comparisons"]) == 6  # 2 pairs x (final, mean, gain)
    assert "| search - search_unmasked | final |" in (out / "summary.md").read_text()

"""The reward-model miniature's spec and preparation with a stand-in for `jaxrl-llm rm` (no
training): both arms parse, train on one reward each, and validate on the math rule."""

import json

import gin
import pytest

from jaxrl_llm.config import parse_gin, resolve_gin_file
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.repro import rm_stage
from jaxrl_llm.repro.specs import PrepOptions, get_repro


@pytest.fixture(autouse=True)
def _no_bindings_left():
    yield
    gin.clear_config()


def _fake_rm(tmp_path, calls):
    def fake(params):
        calls.append(params)
        hf = tmp_path / "rm/hf"
        hf.mkdir(parents=True, exist_ok=True)
        (hf / "config.json").write_text("{}")
        return {"step": 5, "val/accuracy": 0.75, "val/loss": 0.5}

    return fake


def test_spec_arms_parse_and_validate_on_the_rule(tmp_path, monkeypatch):
    repro = get_repro("rm")
    assert [a.name for a in repro.arms] == ["rm", "rule"] and repro.comparisons == (("rm", "rule"),)
    assert repro.prepare_fn() is rm_stage.prepare_rm
    calls = []
    monkeypatch.setattr(rm_stage, "rm_run", _fake_rm(tmp_path, calls))
    prepared = rm_stage.prepare_rm(PrepOptions(tmp_path, (0, 1), prep_steps=5))
    assert calls == [[f"RMConfig.out_dir = '{tmp_path / 'rm'}'", "RMConfig.steps = 5"]]
    assert prepared.notes["rm_val_accuracy"] == 0.75
    rm = f"rm:{tmp_path / 'rm/hf'}"
    trained_on = {"rm": rm, "rule": "math"}
    for arm in repro.arms:
        assert all(resolve_gin_file(f).is_file() for f in arm.gin_files)
        parse_gin(list(arm.gin_files), [*arm.gin_params, *prepared.params(arm.name, 1)])
        cfg = RLConfig()
        weights = cfg.reward.rewards()
        assert set(weights) == {rm, "math"} and weights[trained_on[arm.name]] == 1.0
        assert sum(weights.values()) == 1.0  # the other reward is logged at weight 0
        assert cfg.validation_reward().rewards() == {"math": 1.0}


def test_a_finished_reward_model_is_reused(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(rm_stage, "rm_run", _fake_rm(tmp_path, calls))
    rm_stage.prepare_rm(PrepOptions(tmp_path, (0,), prep_steps=5))
    again = rm_stage.prepare_rm(PrepOptions(tmp_path, (0,), prep_steps=5))
    assert len(calls) == 1 and again.notes["reused"] is True
    assert json.loads((tmp_path / "rm/prepared.json").read_text())["rm_steps"] == 5
    rm_stage.prepare_rm(PrepOptions(tmp_path, (0,), prep_steps=6))  # another budget: retrained
    assert len(calls) == 2


def test_reward_table_from_run_metrics(tmp_path):
    runs = {}
    for arm, rise in (("rm", 0.1), ("rule", 0.0)):
        runs[arm] = []
        for seed in (0, 1):
            run_dir = tmp_path / f"{arm}-{seed}"
            run_dir.mkdir()
            rows = [{"step": 0, "val/test_score": 0.5}]
            rows += [
                {
                    "step": s,
                    rm_stage.RM_KEY: rise * s,
                    rm_stage.RULE_KEY: 0.5,
                    rm_stage.TOOL_KEY: 1.0,
                }
                for s in range(1, 7)
            ]
            rows += [{"step": 6, "val/test_score": 0.5}]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            runs[arm].append({"seed": seed, "run_dir": str(run_dir)})
    summary = rm_stage.reward_summary({"arms": {a: {"runs": r} for a, r in runs.items()}})
    assert summary["rm"]["rm_start"]["mean"] == pytest.approx(0.2)  # steps 1-3
    assert summary["rm"]["rm_end"]["mean"] == pytest.approx(0.5)  # steps 4-6
    assert summary["rule"]["rm_change"]["mean"] == 0.0
    assert summary["rm"]["curves"][0]["val"] == [0.5, 0.5]
    assert (
        "| rm | 0.200 -> 0.500 | 0.300 [0.300, 0.300] | 0.500 -> 0.500 |"
        in rm_stage.reward_table(summary)
    )
    paired = {"rm - rule": rm_stage.paired_ends(summary, "rm", "rule")}
    assert paired["rm - rule"]["rm"]["mean"] == pytest.approx(0.5)  # 0.5 - 0.0 at each seed
    assert "| rm - rule, paired by seed | end: 0.500" in rm_stage.reward_table(summary, paired)
    rm_stage.plot_rewards(summary, tmp_path / "rewards.png")
    assert (tmp_path / "rewards.png").read_bytes()[:4] == b"\x89PNG"

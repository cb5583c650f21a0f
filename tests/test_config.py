"""Bad configuration fails before anything compiles, and the message names the key."""

from pathlib import Path

import pytest

from jaxrl_llm.config import CONFIGS_DIR, ConfigError, parse_gin, resolve_gin_file
from jaxrl_llm.learner.rl_config import RLConfig

NOT_RL = {"base.gin", "sft_tiny.gin", "sft_tiny_stage2.gin"}  # include-only file, SFT configs


@pytest.mark.parametrize(
    "name", sorted(p.name for p in CONFIGS_DIR.glob("*.gin") if p.name not in NOT_RL)
)
def test_shipped_configs_parse_and_validate(name):
    parse_gin([name])
    cfg = RLConfig()
    cfg.validate()
    first_line = (CONFIGS_DIR / name).read_text().splitlines()[0]
    assert first_line.startswith("# jaxrl-llm train"), "configs start with their command"


def test_unknown_parameter_is_named():
    with pytest.raises(ConfigError, match="lrr"):
        parse_gin([], ["OptimConfig.lrr = 0.1"])


def test_unknown_configurable_is_named():
    with pytest.raises(ConfigError, match="AlgoConfg"):
        parse_gin([], ["AlgoConfg.estimator = 'grpo'"])


def test_missing_gin_file():
    with pytest.raises(ConfigError, match=r"nope\.gin"):
        resolve_gin_file("nope.gin")


@pytest.mark.parametrize(
    ("binding", "named"),
    [
        ("AlgoConfig.estimator = 'grpoo'", "grpoo"),
        ("AlgoConfig.loss_agg = 'mean'", "mean"),
        ("AlgoConfig.kl_loss_kind = 'k9'", "k9"),
        ("AlgoConfig.mini_batches = 3", "mini_batches"),
        ("RolloutConfig.tool = 'calculator'", "rollout.tool"),
        ("RolloutConfig.n = 1", "rollout.n"),
        ("OptimConfig.decay = 'exp'", "decay"),
        ("OptimConfig.lr = -1.0", "lr"),
    ],
)
def test_bad_values_are_named(binding, named):
    with pytest.raises(ValueError, match=named):
        parse_gin(["grpo_tiny.gin"], [binding])
        RLConfig().validate()


@pytest.mark.parametrize("form", ["ppo_tiny.gin", "ppo_tiny", "configs/ppo_tiny.gin"])
def test_gin_file_forms_resolve_from_any_directory(form, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_gin_file(form) == CONFIGS_DIR / "ppo_tiny.gin"


def test_an_existing_path_wins_over_a_shipped_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    mine = tmp_path / "configs" / "ppo_tiny.gin"
    mine.write_text("include 'base.gin'\nRLConfig.steps = 3\n")
    assert resolve_gin_file("configs/ppo_tiny.gin") == Path("configs/ppo_tiny.gin")
    parse_gin(["configs/ppo_tiny.gin"])  # its include is found among the shipped files
    assert RLConfig().steps == 3


def test_a_missing_file_elsewhere_is_not_replaced_by_a_shipped_one(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        resolve_gin_file(tmp_path / "ppo_tiny.gin")


def test_configs_live_only_in_the_package():
    """The shipped configs are package data; a top-level configs/ folder would not be
    installed by `pip install .` (move new files to jaxrl_llm/configs/)."""
    repo = CONFIGS_DIR.parent.parent
    assert sorted(p.name for p in repo.glob("configs/*.gin")) == []
    assert (CONFIGS_DIR / "grpo_tiny.gin").is_file()

"""Every refusal of `RLConfig.validate` is a `ConfigError` (the CLI's one line, exit 2),
including the registries' unknown names and the cross-field rules."""

import dataclasses

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.rl_config import RLConfig


def _with(cfg: RLConfig, part: str, **changes) -> RLConfig:
    return dataclasses.replace(cfg, **{part: dataclasses.replace(getattr(cfg, part), **changes)})


@pytest.mark.parametrize(
    ("part", "changes", "match"),
    [
        ("algo", {"estimator": "grpoo"}, r"unknown advantage 'grpoo'"),
        ("algo", {"policy_loss": "ppoo"}, r"unknown policy_loss 'ppoo'"),
        ("algo", {"mini_batches": 3}, r"mini_batches = 3 does not divide"),
        ("rollout", {"n": 1}, r"needs rollout.n >= 2"),
        ("rollout", {"tool": "search"}, r"search"),
    ],
)
def test_each_refusal_is_a_config_error(part, changes, match):
    cfg = _with(RLConfig(), part, **changes)
    with pytest.raises(ConfigError, match=match):
        cfg.validate()


def test_partial_rollouts_without_overlap_is_a_config_error():
    with pytest.raises(ConfigError, match=r"partial_rollouts needs RLConfig.max_staleness"):
        dataclasses.replace(RLConfig(), partial_rollouts=True).validate()


def test_a_sample_longer_than_the_model_s_context_is_refused(tmp_path, caplog):
    import json
    import shutil

    from jaxrl_llm.assets import builtin_checkpoint
    from jaxrl_llm.learner.run import check_context

    src = builtin_checkpoint()  # max_position_embeddings = 1024
    check_context(1024, src)  # the last position the model knows
    with pytest.raises(ConfigError, match=r"1025 tokens exceed .*max_position_embeddings = 1024"):
        check_context(1025, src)
    scaled = tmp_path / "scaled"
    shutil.copytree(src, scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    (scaled / "config.json").write_text(json.dumps(config))
    check_context(2048, scaled)  # RoPE scaling may extend it: a warning, not a refusal
    assert "may cover them" in caplog.text

"""A wrong value in a gin binding or config field is a `ConfigError` (one line, exit status
2 from the command line), not a ValueError / KeyError / TypeError / ImportError traceback."""

import pytest

from jaxrl_llm import cli
from jaxrl_llm.config import parse_gin
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.config import DataConfig
from jaxrl_llm.rewards.config import RewardConfig, check_rewards
from jaxrl_llm.rollout.config import RolloutConfig

GIN = [
    ("import missing_mod_xyz", r"No module named 'missing_mod_xyz' \(In bindings string line 1"),
    ("RLConfig.steps = ((", "EOF in multi-line statement"),
    ("Nope.x = 1", r"No configurable matching 'Nope'. \(In bindings string line 1; Nope.x = 1\)"),
]


@pytest.mark.parametrize("binding, message", GIN, ids=[b for b, _ in GIN])
def test_a_bad_gin_binding_is_one_line_when_parsed(binding, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_gin(["grpo_tiny.gin"], [binding])
    assert "\n" not in str(info.value)


def test_a_macro_used_must_be_defined_when_parsed():
    parse_gin([], ["X = 3", "RLConfig.steps = %X", "S/Y = 2", "RLConfig.seed = %S/Y"])
    with pytest.raises(ConfigError, match=r"macro %UNDEFINED_MACRO is used but never defined"):
        parse_gin(["grpo_tiny.gin"], ["RLConfig.steps = %UNDEFINED_MACRO"])
    with pytest.raises(ConfigError, match=r"macro %S/Z is used but never defined"):
        parse_gin([], ["S/Y = 2", "RLConfig.seed = %S/Z"])


CONFIGS = [
    (lambda: RolloutConfig(env="arithmetic", tool="python"), "brings its own tools"),
    (lambda: RolloutConfig(env="chess", tool="none"), "rollout.env = 'chess': expected 'none'"),
    (lambda: RolloutConfig(temperature=float("inf")), "RolloutConfig.temperature = inf: expected"),
    (lambda: RolloutConfig(top_p=float("nan")), "RolloutConfig.top_p = nan: expected"),
    (
        lambda: RolloutConfig(val_temperature=1e39),
        r"RolloutConfig.val_temperature = 1e\+39: expected float",
    ),
    (lambda: DataConfig(builtin_levels=(9,)), r"builtin_levels = \(9,\): expected one or more"),
    (lambda: DataConfig(builtin_levels=()), r"builtin_levels = \(\): expected one or more"),
    (lambda: DataConfig(seed=2**32), r"DataConfig.seed = 4294967296: expected int \(>= 0 and <"),
    (lambda: check_rewards(RewardConfig(name="nope")), "RewardConfig.name: unknown reward 'nope'"),
    (
        lambda: check_rewards(RewardConfig(weights={"math": 1.0, "nope": 0.5})),
        "RewardConfig.weights: unknown reward 'nope'",
    ),
    (
        lambda: check_rewards(RewardConfig(name="no_such_module_xyz:f")),
        "RewardConfig.name: reward = 'no_such_module_xyz:f': cannot import",
    ),
    (
        lambda: check_rewards(RewardConfig(weights={"math": (1.0, {"incorect": 1.0})})),
        "RewardConfig.weights: reward 'math' cannot be called",
    ),
]


@pytest.mark.parametrize("build, message", CONFIGS, ids=[m for _, m in CONFIGS])
def test_a_bad_config_value_is_a_config_error(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


TRAIN = [
    (
        "MeshConfig.tensor = 0",
        "MeshConfig data=1, fsdp=-1, tensor=0: mesh sizes must be positive or -1",
    ),
    ("MeshConfig.data = 3", "MeshConfig data=3, fsdp=-1, tensor=1: 8 devices cannot be split"),
    ("MeshConfig.fsdp = 16", "MeshConfig data=1, fsdp=16, tensor=1: the mesh needs 16 devices"),
    ("RewardConfig.name = 'nope'", "RewardConfig.name: unknown reward 'nope'"),
    ("RolloutConfig.env = 'arithmetic'", "an environment brings its own tools"),
    ("DataConfig.builtin_levels = (9,)", "DataConfig.builtin_levels = (9,)"),
    ("DataConfig.seed = -1", "DataConfig.seed = -1: expected int (>= 0 and < 4294967296)"),
    ("RLConfig.steps = %UNDEFINED_MACRO", "macro %UNDEFINED_MACRO is used but never defined"),
    ("import missing_mod_xyz", "No module named 'missing_mod_xyz'"),
    (
        "RolloutConfig.tool = 'no_such_module_xyz:f'",
        "rollout.tool = 'no_such_module_xyz:f': cannot",
    ),
    ("RolloutConfig.backend = 'no_such_module_xyz:f'", "rollout.backend = 'no_such_module_xyz:f'"),
    (
        "RolloutConfig.tool = 'json:__doc__'",
        "rollout.tool = 'json:__doc__' is a str, not a function",
    ),
]


@pytest.mark.parametrize("binding, message", TRAIN, ids=[b for b, _ in TRAIN])
def test_train_refuses_before_anything_opens(binding, message, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["train", "--run_dir", str(run_dir), "--gin_param", binding]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("jaxrl-llm train: configuration error: ") and message in first, err
    assert "In call to configurable" not in err  # gin's trace lines left out
    assert "Traceback" not in err
    assert not run_dir.exists()  # no checkpoint folder opened, no config.gin written


@pytest.mark.parametrize("env", ["chess", "no_such_module_xyz:make_env"])
def test_train_refuses_an_environment_it_cannot_build(env, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["train", "--run_dir", str(run_dir), "--gin_param", f"RolloutConfig.env = {env!r}"]
    assert cli.main([*argv, "--gin_param", "RolloutConfig.tool = 'none'"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxrl-llm train: configuration error: rollout.env = {env!r}"), err
    assert "Traceback" not in err and not run_dir.exists()


def test_train_refuses_the_chat_template_a_base_tokenizer_lacks(builtin_copy, tmp_path, capsys):
    """DataConfig.template = 'chat' (the default) on a checkpoint whose tokenizer has no chat
    template (a base model's) is one line before any folder opens or the model loads."""
    (builtin_copy / "chat_template.jinja").unlink()
    run_dir = tmp_path / "run"
    argv = ["train", "--run_dir", str(run_dir),
            "--gin_param", f"PolicyConfig.checkpoint = '{builtin_copy}'"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-llm train: configuration error: DataConfig.template = 'chat'")
    assert "use 'raw' or 'torl'" in err and "Traceback" not in err, err
    assert not run_dir.exists()

"""Bad configuration fails before anything compiles, and the message names the key."""

import ast
import dataclasses
import importlib
import re
import subprocess
import sys
import typing
from pathlib import Path

import gin
import pytest

from jaxrl_llm.config import CONFIGS_DIR, ConfigError, parse_gin, resolve_gin_file
from jaxrl_llm.config_checks import Gt, checked_fields
from jaxrl_llm.data.sources import SourceConfig
from jaxrl_llm.learner.rl_config import AlgoConfig, RLConfig

# include-only file, SFT and reward-model configs
NOT_RL = {
    "base.gin",
    "sft_tiny.gin",
    "sft_tiny_stage2.gin",
    "torl_sft_tiny.gin",
    "search_sft_tiny.gin",
    "agent_sft_tiny.gin",
    "rm_tiny.gin",
}


@pytest.mark.parametrize(
    "name", sorted(p.name for p in CONFIGS_DIR.glob("*.gin") if p.name not in NOT_RL)
)
def test_shipped_configs_parse_and_validate(name):
    text = (CONFIGS_DIR / name).read_text()
    # Paper configs leave paths as "SET_..." macros; give each a value as a user would.
    macros = re.findall(r'^(\w+) = "SET_\w+"', text, flags=re.M)
    parse_gin([name], [f'{m} = "/data/{m.lower()}"' for m in macros])
    cfg = RLConfig()
    cfg.validate()
    first_line = (CONFIGS_DIR / name).read_text().splitlines()[0]
    assert first_line.startswith(("# jaxrl-llm train", "# jaxrl-llm bench")), (
        "configs start with their command"
    )


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


def test_configs_live_at_the_top_level_and_import_as_package_data():
    """The shipped configs sit in the repository's top-level configs/ (the design card's
    layout) and are the package `jaxrl_llm.configs`; none hides inside the package folder."""
    import jaxrl_llm

    package = Path(jaxrl_llm.__file__).resolve().parent
    assert package.parent / "configs" == CONFIGS_DIR
    assert (CONFIGS_DIR / "grpo_tiny.gin").is_file()
    assert not (package / "configs").exists()


def _config_classes() -> list[type]:
    """Every dataclass in the package decorated with `gin.configurable` or named *Config,
    found by reading the sources (so a new one cannot be missed)."""
    root = CONFIGS_DIR.parent / "jaxrl_llm"
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            names = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
            is_dataclass = "dataclasses.dataclass" in names
            if is_dataclass and ("gin.configurable" in names or node.name.endswith("Config")):
                module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
                found.append(getattr(importlib.import_module(module), node.name))
    return found


CONFIG_CLASSES = _config_classes()
REQUIRED = {"SourceConfig": {"path": "x.jsonl"}}  # fields without a default


def _default(cls):
    if cls.__name__ == "PipelineConfig":
        return cls(source=_default(SourceConfig))
    return cls(**REQUIRED.get(cls.__name__, {}))


def test_the_config_classes_are_found():
    names = {c.__name__ for c in CONFIG_CLASSES}
    assert {"RLConfig", "OptimConfig", "RolloutConfig", "SFTConfig", "ModelConfig"} <= names


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_every_field_of_every_config_rejects_a_wrong_type_by_name(cls):
    base = _default(cls)
    hints = typing.get_type_hints(cls)
    checked = [f.name for f in dataclasses.fields(cls) if hints[f.name] is not typing.Any]
    assert checked, cls
    for name in checked:
        with pytest.raises(ConfigError, match=rf"^{cls.__name__}\.{name} = <object"):
            dataclasses.replace(base, **{name: object()})


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        ('OptimConfig.lr = "abc"', "OptimConfig.lr = 'abc': expected float (> 0)"),
        ("OptimConfig.lr = -1.0", "OptimConfig.lr = -1.0: expected float (> 0)"),
        (
            "OptimConfig.decay = 'exp'",
            "OptimConfig.decay = 'exp': expected str (one of 'constant', 'cosine', 'linear')",
        ),
        ("DataConfig.prompts_per_step = True", "DataConfig.prompts_per_step = True: expected int"),
        ("AlgoConfig.gamma = 2.0", "AlgoConfig.gamma = 2.0: expected float (>= 0 and <= 1)"),
        ("AlgoConfig.dual_clip_c = 0.5", "AlgoConfig.dual_clip_c = 0.5: expected float | None"),
        ("RolloutConfig.n = 0", "RolloutConfig.n = 0: expected int (>= 1)"),
        ("RolloutConfig.top_p = 0.0", "RolloutConfig.top_p = 0.0: expected float (> 0 and <= 1)"),
        ("PolicyConfig.remat = 'yes'", "PolicyConfig.remat = 'yes': expected bool"),
        (
            "PolicyConfig.dtype = 'bf16'",
            "PolicyConfig.dtype = 'bf16': expected str (one of 'float32', 'bfloat16', 'float16')",
        ),
        (
            "PolicyConfig.rollout_dtype = 'int8'",
            "PolicyConfig.rollout_dtype = 'int8': expected str | None (one of 'float32', ",
        ),
    ],
)
def test_a_wrong_value_names_class_field_value_and_expectation(binding, message):
    parse_gin(["grpo_tiny.gin"], [binding])
    with pytest.raises(ConfigError) as info:
        RLConfig()
    assert str(info.value).splitlines()[0].startswith(message)


def test_gin_lists_become_tuples_and_ints_floats():
    parse_gin([], ["DataConfig.builtin_levels = [1, 2]", "OptimConfig.lr = 1"])
    cfg = RLConfig()
    assert cfg.data.builtin_levels == (1, 2)
    assert type(cfg.optim.lr) is float
    assert AlgoConfig(dual_clip_c=None).dual_clip_c is None  # None passes a range


@pytest.mark.slow  # 13 s in a loaded 2-worker run, AMD EPYC AVX2
def test_the_cli_prints_the_message_without_a_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_llm.cli", "train", '--gin_param=OptimConfig.lr="abc"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "OptimConfig.lr = 'abc': expected float (> 0)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_range_on_a_missing_field_fails_at_definition():
    with pytest.raises(TypeError, match="no fields named"):

        @dataclasses.dataclass(frozen=True)
        @checked_fields(lrr=Gt(0))
        class Wrong:
            lr: float = 1.0


def test_gspo_with_ppo_clip_ranges_warns(caplog):
    parse_gin(["grpo_tiny.gin"], ["AlgoConfig.policy_loss = 'gspo'"])
    RLConfig().validate()
    assert "policy_loss 'gspo' clips its ratio at (1 - 0.2, 1 + 0.2)" in caplog.text
    assert "its paper uses 0.0003 / 0.0004" in caplog.text
    caplog.clear()
    parse_gin(
        ["grpo_tiny.gin"],
        [
            "AlgoConfig.policy_loss = 'gspo'",
            "AlgoConfig.clip_low = 3e-4",
            "AlgoConfig.clip_high = 4e-4",
        ],
    )
    RLConfig().validate()
    assert "'gspo'" not in caplog.text


def test_a_placeholder_left_unset_is_named():
    parse_gin(["torl_grpo_qwen2.5_math_1.5b.gin"])
    with pytest.raises(ValueError, match=r"PolicyConfig.checkpoint = 'SET_CHECKPOINT_PATH'"):
        RLConfig().validate()


def test_unmasked_tool_output_without_a_tool_warns(caplog):
    parse_gin(["torl_tiny_notool.gin"], ["AlgoConfig.mask_tool_output = False"])
    RLConfig().validate()
    assert "mask_tool_output = False has no effect" in caplog.text
    caplog.clear()
    parse_gin(["search_r1_tiny.gin"], ["AlgoConfig.mask_tool_output = False"])
    RLConfig().validate()
    assert "mask_tool_output" not in caplog.text
    try:
        with pytest.raises(ConfigError, match="mask_tool_output"):
            parse_gin([], ["AlgoConfig.mask_tool_output = 'no'"])
            AlgoConfig()
    finally:
        gin.clear_config()  # the bad binding would reach the next AlgoConfig of this worker

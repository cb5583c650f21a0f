"""A wrong `LoraConfig` is a `ConfigError` naming the field (one line and exit status 2 from
`jaxrl-llm train`), not a traceback and not a run that adapts fewer weights than asked: a
target that matches no weight is refused even beside one that matches; a non-finite alpha
is refused; a resume with another alpha is refused with a value one can paste into gin."""

import math

import pytest

from jaxrl_llm import cli
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.checkpoint import CheckpointError, base_identity, check_base
from jaxrl_llm.learner.rl_config import PolicyConfig
from jaxrl_llm.models import init_model
from jaxrl_llm.models.lora import LoraConfig, adapted_weights, adapters, apply_lora
from jaxrl_llm.testing import tiny_config

CFG = tiny_config()


@pytest.mark.parametrize("alpha", [math.inf, -math.inf, math.nan])
def test_a_non_finite_alpha_is_refused(alpha):
    with pytest.raises(ConfigError, match=r"LoraConfig\.alpha = (-?inf|nan): expected"):
        LoraConfig(alpha=alpha)


@pytest.mark.parametrize(
    "targets, message",
    [((), r"LoraConfig\.targets = \(\): expected at least one"),
     (("q_proj", "["), r"LoraConfig\.targets: '\[' is not a regular expression")],
)  # fmt: skip
def test_bad_targets_are_config_errors(targets, message):
    with pytest.raises(ConfigError, match=message):
        LoraConfig(targets=targets)


@pytest.mark.parametrize("unmatched", ["qproj", "embed_tokens", "Q_PROJ", "self_attn.q_proj"])
def test_a_target_that_matches_nothing_is_refused_beside_one_that_matches(unmatched):
    cfg = LoraConfig(rank=2, targets=("q_proj", unmatched))
    model = init_model(CFG, seed=1)
    want = rf"LoraConfig\.targets = .*: no weight matched '{unmatched}'; expected projection names"
    with pytest.raises(ConfigError, match=want):
        apply_lora(model, cfg, seed=0)
    assert not list(adapters(model))  # refused before any adapter was attached
    paths = ["model/embed_tokens/embedding", "model/layers/0/self_attn/q_proj"]
    with pytest.raises(ConfigError, match=want):  # the planner's choice refuses it too
        adapted_weights(cfg, paths)


def test_a_per_layer_target_in_scanned_layers_is_a_config_error():
    model = init_model(tiny_config(scan_layers=True), seed=1)
    with pytest.raises(ConfigError, match=r"scan_layers = True stacks the layers"):
        apply_lora(model, LoraConfig(targets=(r"model/layers/0/self_attn/q_proj",)), seed=0)


TRAIN = [
    (["LoraConfig.targets = ('[',)"], "LoraConfig.targets: '[' is not a regular expression"),
    (["LoraConfig.targets = ()"], "LoraConfig.targets = (): expected at least one"),
    (["LoraConfig.targets = ('q_proj', 'qproj')"], "no weight matched 'qproj'"),
    (["LoraConfig.alpha = 1e999"], "LoraConfig.alpha = inf: expected float (> 0)"),
    (
        ["PolicyConfig.scan_layers = True", "LoraConfig.targets = ('model/layers/0/mlp/up_proj',)"],
        "scan_layers = True stacks the layers",
    ),
]


@pytest.mark.parametrize("bindings, message", TRAIN, ids=[m for _, m in TRAIN])
def test_train_ends_a_bad_lora_config_with_one_line(bindings, message, tmp_path, capsys):
    argv = ["train", "--run_dir", str(tmp_path / "run")]
    for binding in ["PolicyConfig.lora = @LoraConfig()", *bindings]:
        argv += ["--gin_param", binding]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxrl-llm train: configuration error: "), err
    assert message in lines[0], err


def test_a_resume_with_another_alpha_names_values_to_paste_into_gin():
    """The refusal quotes alpha as the float gin takes (64.0), not as the string the record
    keeps ('64.0'), for both the current and the recorded value."""
    identity = lambda alpha: base_identity(
        builtin_checkpoint(), PolicyConfig(lora=LoraConfig(rank=4, alpha=alpha))
    )
    saved = identity(32.0)
    assert saved["lora_alpha"] == "32.0"  # recorded as a string: old checkpoints read the same
    with pytest.raises(CheckpointError) as info:
        check_base(saved, identity(64.0), field="PolicyConfig.checkpoint", step_dir="ckpt/4",
                   loaded_as=True)  # fmt: skip
    message = str(info.value)
    assert message.startswith("LoraConfig.alpha = 64.0: checkpoint ckpt/4 was trained with "
                              "LoraConfig.alpha = 32.0 "), message  # fmt: skip
    assert "resume with LoraConfig.alpha = 32.0, or start a new run_dir" in message

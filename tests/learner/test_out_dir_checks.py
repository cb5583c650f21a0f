"""`sft` and `rm` check their settings and inputs before they write anything into out_dir,
and refuse an out_dir that holds a finished model (hf/) unless `--overwrite` is given."""

import pytest

from jaxrl_llm import cli
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.sft import SFTConfig

# The smallest runs the two commands make (steps = 0: load, export), for the cases that go on.
SMALL = {
    "sft": ["SFTConfig.n_train = 4", "SFTConfig.n_val = 0", "SFTConfig.steps = 0",
            "SFTConfig.batch_size = 2"],
    "rm": ["RMConfig.n_train = 4", "RMConfig.n_val = 1", "RMConfig.steps = 0",
           "RMConfig.batch_size = 2"],
}  # fmt: skip
OWNER = {"sft": "SFTConfig", "rm": "RMConfig"}


def _argv(command: str, out, *params: str) -> list[str]:
    bindings = [*SMALL[command], f"{OWNER[command]}.out_dir = '{out}'", *params]
    return [command] + [a for p in bindings for a in ("--gin_param", p)]


def test_sft_micro_batches_must_divide_the_batch_when_the_config_is_built():
    with pytest.raises(
        ConfigError, match=r"SFTConfig.batch_size = 6 is not divisible by SFTConfig"
    ):
        SFTConfig(batch_size=6, micro_batches=4)
    assert SFTConfig(batch_size=6, micro_batches=3).micro_batches == 3


BAD = [
    ("sft", ["SFTConfig.batch_size = 6", "SFTConfig.micro_batches = 4"], "is not divisible by"),
    ("rm", ["RMConfig.batch_size = 6", "RMConfig.micro_batches = 4"], "is not divisible by"),
    ("sft", ["SFTConfig.train_file = '/nonexistent/rows.jsonl'"], "SFTConfig.train_file"),
    ("rm", ["RMConfig.train_file = '/nonexistent/pairs.jsonl'"], "/nonexistent/pairs.jsonl"),
    ("sft", ["SFTConfig.seq_len = 4"], "no example fits in seq_len=4"),
]


@pytest.mark.parametrize("command, params, message", BAD, ids=[m for _, _, m in BAD])
def test_a_refused_run_writes_nothing_into_out_dir(command, params, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(_argv(command, out, *params)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxrl-llm {command}: configuration error: ") and message in err, err
    assert not (out / "config.gin").exists()


@pytest.mark.parametrize("command", ["sft", "rm"])
def test_an_out_dir_with_a_finished_model_is_refused_unless_overwrite(command, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "hf").mkdir(parents=True)
    (out / "config.gin").write_text("# the finished run's config\n")
    assert cli.main(_argv(command, out)) == 2
    err = capsys.readouterr().err
    assert f"{OWNER[command]}.out_dir {out} already holds a trained model" in err, err
    assert "pass --overwrite to replace it" in err and len(err.strip().splitlines()) == 1
    assert (out / "config.gin").read_text() == "# the finished run's config\n"
    assert cli.main([*_argv(command, out), "--overwrite"]) == 0
    assert "out_dir" in (out / "config.gin").read_text()  # this run's resolved config
    assert (out / "hf" / "config.json").is_file()

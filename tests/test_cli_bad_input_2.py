"""Bad inputs to sft, generate, train and repro end the command with one line and exit 2,
before anything is loaded or written: lengths past the model's context, chat templates that
are missing or do not parse, unreadable prompt files, and repro's flags and results.json."""

from __future__ import annotations

import shutil
from pathlib import Path

import gin
import pytest

from jaxrl_llm import cli
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.config_checks import ConfigError

CONTEXT = 1024  # the built-in model's max_position_embeddings


@pytest.fixture(autouse=True)
def clean_gin():
    yield
    gin.clear_config()


def _never(*_args, **_kwargs):
    raise AssertionError("loaded before the input was checked")


def _one_line(capsys, start: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith(start), err[-1]
    return err[-1]


def _checkpoint(tmp_path: Path, template: str | None) -> Path:
    """The built-in checkpoint with `template` as its chat template (None: none)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(builtin_checkpoint(), ckpt)
    (ckpt / "chat_template.jinja").unlink()
    if template is not None:
        (ckpt / "chat_template.jinja").write_text(template)
    return ckpt


def test_sft_seq_len_past_the_context_is_refused_before_the_tokenizer(
    tmp_path, capsys, monkeypatch
):
    from jaxrl_llm.learner import sft

    monkeypatch.setattr(sft, "load_tokenizer", _never)
    out = tmp_path / "sft"
    argv = ["sft", "--gin_param", f"SFTConfig.out_dir = '{out}'"]
    argv += ["--gin_param", f"SFTConfig.seq_len = {CONTEXT + 1}"]
    assert cli.main(argv) == 2
    line = _one_line(capsys, "jaxrl-llm sft: configuration error: SFTConfig.seq_len = 1025")
    assert "max_position_embeddings = 1024" in line
    assert not out.exists()


def test_rm_seq_len_past_the_context_is_refused_before_the_pairs_are_read(
    tmp_path, capsys, monkeypatch
):
    """As sft: `rm` allocated rows of RMConfig.seq_len for every pair before any check."""
    from jaxrl_llm.learner import reward_training

    monkeypatch.setattr(reward_training, "load_tokenizer", _never)
    out = tmp_path / "rm"
    argv = ["rm", "--gin_param", f"RMConfig.out_dir = '{out}'"]
    argv += ["--gin_param", f"RMConfig.seq_len = {CONTEXT + 1}"]
    assert cli.main(argv) == 2
    line = _one_line(capsys, "jaxrl-llm rm: configuration error: RMConfig.seq_len = 1025")
    assert "max_position_embeddings = 1024" in line
    assert not out.exists()


@pytest.mark.parametrize("case", ["max_new_tokens", "long_prompt"])
def test_generate_past_the_context_is_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch, case
):
    from jaxrl_llm.rollout import commands

    monkeypatch.setattr(commands, "load_sampling_model", _never)
    argv = ["generate", "--checkpoint", "builtin"]
    if case == "max_new_tokens":
        argv += ["--max-new-tokens", "100000000"]
    else:
        argv += ["--prompt", "1 + " * 700]  # over 1024 tokens with 64 new ones
    assert cli.main(argv) == 2
    line = _one_line(capsys, "jaxrl-llm generate: configuration error: the longest prompt")
    assert "--max-new-tokens" in line and "max_position_embeddings = 1024" in line


def test_generate_chat_without_a_template_is_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch
):
    from jaxrl_llm.rollout import commands

    monkeypatch.setattr(commands, "load_sampling_model", _never)
    ckpt = _checkpoint(tmp_path, None)
    assert cli.main(["generate", "--checkpoint", str(ckpt), "--chat"]) == 2
    _one_line(capsys, "jaxrl-llm generate: configuration error: --chat renders prompts")


def test_a_chat_template_that_does_not_parse_is_a_config_error(tmp_path):
    from jaxrl_llm.data.templates import check_chat_template
    from jaxrl_llm.models import load_tokenizer

    tokenizer = load_tokenizer(_checkpoint(tmp_path, "{{ bad jinja"))
    with pytest.raises(ConfigError, match=r"--chat: .*ckpt.*chat template does not render"):
        check_chat_template(tokenizer, "--chat")


def test_generate_chat_with_a_broken_template_is_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch
):
    from jaxrl_llm.rollout import commands

    monkeypatch.setattr(commands, "load_sampling_model", _never)
    ckpt = _checkpoint(tmp_path, "{{ bad jinja")
    assert cli.main(["generate", "--checkpoint", str(ckpt), "--chat"]) == 2
    _one_line(capsys, "jaxrl-llm generate: configuration error: --chat: ")


def test_train_with_a_broken_template_writes_nothing(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path, "{{ bad jinja")
    run = tmp_path / "run"
    argv = ["train", "--run_dir", str(run), "--gin_param", f"PolicyConfig.checkpoint = '{ckpt}'"]
    argv += ["--gin_param", "DataConfig.template = 'chat'"]
    assert cli.main(argv) == 2
    _one_line(capsys, "jaxrl-llm train: configuration error: DataConfig.template = 'chat': ")
    assert not run.exists()


def test_train_past_the_context_writes_no_checkpoints_folder(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--run_dir", str(run), "--gin_param", "RolloutConfig.max_new_tokens = 2000"]
    assert cli.main(argv) == 2
    _one_line(capsys, "jaxrl-llm train: configuration error: DataConfig.max_prompt_length")
    assert not (run / "checkpoints").exists()


@pytest.mark.parametrize("case", ["not_utf8", "folder"])
def test_generate_an_unreadable_prompts_file_is_one_line(tmp_path, capsys, monkeypatch, case):
    from jaxrl_llm.rollout import commands

    monkeypatch.setattr(commands, "load_sampling_model", _never)
    path = tmp_path / "prompts.txt"
    if case == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"What is \xff\xfe?\n")
    assert cli.main(["generate", "--prompts-file", str(path)]) == 2
    line = _one_line(capsys, f"jaxrl-llm generate: configuration error: --prompts-file '{path}'")
    assert ("is a folder" if case == "folder" else "UTF-8") in line


@pytest.mark.parametrize(
    ("flags", "results", "says"),
    [
        (["--seeds", "0"], None, "--seeds = 0"),
        (["--steps", "-1"], None, "--steps = -1"),
        (["--prep-steps", "0"], None, "--prep-steps = 0"),
        (["--report-only"], "{not json", "is not JSON"),
        (["--report-only"], "{}", "has no 'arms'"),
        (["--report-only"], '{"arms": {"full": {"runs": [{}]}}}', "'arm'"),
    ],
)
def test_repro_bad_flags_and_results_are_one_line(tmp_path, capsys, flags, results, says):
    out = tmp_path / "out"
    if results is not None:
        out.mkdir()
        (out / "results.json").write_text(results)
    assert cli.main(["repro", "limr", "--out", str(out), *flags]) == 2
    line = _one_line(capsys, "jaxrl-llm repro: configuration error: ")
    assert says in line, line
    if results is None:
        assert not out.exists()
    else:  # left as it was, nothing beside it
        assert [p.name for p in out.iterdir()] == ["results.json"]
        assert (out / "results.json").read_text() == results

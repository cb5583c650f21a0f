"""`jaxrl-llm train --resume` and `jaxrl-llm export` meet bad input as a user does, through
`jaxrl_llm.cli.main`: a damaged checkpoint step, a resume with other data, a base whose model
config changed under a full run each end the command with one line (exit 2) that names the
fix, and nothing is removed; an export keeps the base's generation_config.json. One 1-step
full run of the shipped tiny model, trained once for the module and copied per test."""

import json
import logging
import shutil

import pytest
from transformers import GenerationConfig

from jaxrl_llm import cli
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.testing import register_test_rewards

from .rl_helpers import TINY_RL_PARAMS

pytestmark = pytest.mark.slow  # one 1-step run (15 s); resumes and exports of it (5 s each)

ONE_STEP = [*TINY_RL_PARAMS, "RLConfig.steps = 1", "RLConfig.save_every = 1"]
ERROR = "jaxrl-llm {}: configuration error: "
SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
            "repetition_penalty": 1.05, "bos_token_id": 1}  # fmt: skip


def _train(run_dir, base, *params, resume=False):
    argv = ["train", "--gin_file", "base.gin", "--run_dir", str(run_dir)]
    for p in [*ONE_STEP, f"PolicyConfig.checkpoint = '{base}'", *params]:
        argv += ["--gin_param", p]
    return cli.main([*argv, *(["--resume"] if resume else [])])


def _export(run_dir, out):
    return cli.main(["export", "--run", str(run_dir), "--out", str(out)])


def _one_line(capsys, command: str) -> str:
    """The error line a failed command ended with; no traceback before it."""
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith(ERROR.format(command)), err[-1]
    return err[-1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run_dir, base): a finished 1-step run from a copy of the shipped model whose
    generation_config.json holds sampling defaults."""
    register_test_rewards()
    root = tmp_path_factory.mktemp("trained")
    base, run = root / "base", root / "run"
    shutil.copytree(builtin_checkpoint(), base)
    (base / "generation_config.json").write_text(json.dumps(SAMPLING))
    assert _train(run, base) == 0
    return run, base


@pytest.fixture
def run(trained, tmp_path, capsys):
    """A copy of the trained run (its config.gin names the module's base)."""
    register_test_rewards()
    copy = tmp_path / "run"
    shutil.copytree(trained[0], copy)
    capsys.readouterr()
    return copy


def test_a_resume_with_other_data_ends_with_one_line(run, trained, capsys):
    assert _train(run, trained[1], "DataConfig.builtin_train_size = 24", resume=True) == 2
    line = _one_line(capsys, "train")
    assert str(run / "checkpoints" / "1") in line and "data" in line, line
    assert "DataConfig" in line and "run_dir" in line, line


def test_a_damaged_latest_step_ends_export_and_resume_with_one_line(run, trained, capsys, caplog):
    base, step_dir = trained[1], run / "checkpoints" / "1"
    extra = (step_dir / "extra" / "metadata").read_bytes()
    (step_dir / "extra" / "metadata").write_bytes(b"")
    assert _export(run, run / "out") == 2
    line = _one_line(capsys, "export")
    assert str(step_dir) in line and "move it aside" in line, line
    assert _train(run, base, resume=True) == 2
    line = _one_line(capsys, "train")
    assert str(step_dir) in line and "move it aside" in line, line

    # An empty step folder after it: the export takes step 1, warning; a resume is refused.
    (step_dir / "extra" / "metadata").write_bytes(extra)
    (run / "checkpoints" / "2").mkdir()
    with caplog.at_level(logging.WARNING):
        assert _export(run, run / "out") == 0
    assert any(str(run / "checkpoints" / "2") in r.getMessage() for r in caplog.records)
    assert (run / "out" / "model.safetensors").is_file()
    assert _train(run, base, resume=True) == 2
    line = _one_line(capsys, "train")
    assert "incomplete" in line and "step 1" in line, line
    assert (run / "checkpoints" / "2").is_dir()


def test_a_full_run_is_resumed_and_exported_only_with_its_base_model_config(run, trained, capsys):
    base = trained[1]
    original = (base / "config.json").read_text()
    try:
        (base / "config.json").write_text(json.dumps({**json.loads(original), "rope_theta": 5e5}))
        assert _train(run, base, resume=True) == 2
        line = _one_line(capsys, "train")
        assert "rope_theta: saved 10000.0, now 500000.0" in line, line
        assert _export(run, run / "out") == 2
        line = _one_line(capsys, "export")
        assert "rope_theta: saved 10000.0, now 500000.0" in line, line
        assert not (run / "out").exists()
    finally:
        (base / "config.json").write_text(original)
    assert _export(run, run / "out") == 0


def test_the_runs_hf_folder_and_an_export_keep_the_base_generation_config(run, tmp_path):
    assert _export(run, tmp_path / "out") == 0
    for folder in (run / "hf", tmp_path / "out"):
        written = GenerationConfig.from_pretrained(folder)
        for key, value in SAMPLING.items():
            assert getattr(written, key) == value, (folder, key)

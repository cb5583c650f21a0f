"""A resume or an export that does not fit its run ends with one clean line (exit 2), as
every other bad input of the command line does, not with Orbax's traceback: a checkpoint of
another shape (another LoRA rank, another model, a full run's state into a LoRA run) names
the arrays that differ, saved against expected; a LoRA run resumed or exported onto a base
other than the one it trained on names both. Through `jaxrl_llm.cli.main`, as a user meets
them; each run is one step of the shipped tiny model (one resume trains a second)."""

import json
import logging
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm import cli
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.metrics import read_metrics
from jaxrl_llm.testing import register_test_rewards

from .rl_helpers import TINY_RL_PARAMS

ONE_STEP = [*TINY_RL_PARAMS, "RLConfig.steps = 1", "RLConfig.save_every = 1"]
LORA = ["PolicyConfig.lora = @LoraConfig()", "LoraConfig.rank = 4"]
ERROR = "jaxrl-llm {}: configuration error: "
MLP0 = "policy/params/model/layers/0/mlp/"  # the first adapted weights, in tree order


def _train(run_dir, *params, resume=False):
    argv = ["train", "--gin_file", "base.gin", "--run_dir", str(run_dir)]
    for p in [*ONE_STEP, *params]:
        argv += ["--gin_param", p]
    return cli.main([*argv, *(["--resume"] if resume else [])])


def _export(run_dir, out, fmt="merged"):
    return cli.main(["export", "--run", str(run_dir), "--out", str(out), "--format", fmt])


def _one_line(capsys, command: str) -> str:
    """The error line a failed command ended with; no traceback before it."""
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith(ERROR.format(command)), err[-1]
    return err[-1]


@pytest.mark.slow  # one 1-step LoRA run, two resumes that fail before any step (25 s)
def test_a_checkpoint_of_another_shape_ends_the_resume_with_one_line(tmp_path, capsys):
    register_test_rewards()
    run = tmp_path / "run"
    assert _train(run, *LORA) == 0
    capsys.readouterr()

    # Another LoRA rank: every adapter's shape differs, the saved and expected shapes named.
    assert _train(run, "PolicyConfig.lora = @LoraConfig()", "LoraConfig.rank = 8", resume=True) == 2
    line = _one_line(capsys, "train")
    assert "does not fit" in line and "run_dir" in line, line
    assert f"{MLP0}down_proj_lora_a: saved (384, 4), expected (384, 8)" in line

    # A full run resumed from the LoRA run's checkpoint: the base weights are not in it.
    assert _train(run, resume=True) == 2
    line = _one_line(capsys, "train")
    assert "does not fit" in line, line
    assert "policy/params/model/embed_tokens: not in the checkpoint" in line, line
    assert f"{MLP0}down_proj_lora_a: saved (384, 4), not in this run" in line


@pytest.mark.slow  # a 1-step full run, two resumes that fail before any step (14 s)
def test_a_full_runs_checkpoint_into_a_lora_run_or_another_model_ends_with_one_line(
    tmp_path, capsys
):
    register_test_rewards()
    run = tmp_path / "run"
    assert _train(run) == 0
    capsys.readouterr()
    assert _train(run, *LORA, resume=True) == 2
    line = _one_line(capsys, "train")
    assert f"{MLP0}down_proj_lora_a: not in the checkpoint" in line

    # Another model size (a wider copy of the tiny model's config): its config.json differs
    # from the one the run recorded, named before any model loads.
    other = tmp_path / "wide"
    shutil.copytree(builtin_checkpoint(), other)
    cfg = json.loads((other / "config.json").read_text())
    tensors = {k: _widened(v, cfg) for k, v in load_file(other / "model.safetensors").items()}
    cfg["intermediate_size"] *= 2
    (other / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, other / "model.safetensors")
    assert _train(run, f"PolicyConfig.checkpoint = '{other}'", resume=True) == 2
    line = _one_line(capsys, "train")
    assert "intermediate_size: saved 384, now 768" in line, line


def _widened(w: np.ndarray, cfg: dict) -> np.ndarray:
    """An MLP weight with its intermediate dim doubled (HF layout: gate/up [F, D], down
    [D, F]); every other tensor as it was."""
    f = cfg["intermediate_size"]
    axis = [i for i, n in enumerate(w.shape) if n == f and w.ndim == 2]
    return np.concatenate([w, w], axis=axis[0]) if axis else w


def _perturbed_copy(src, dst):
    """`src`'s files in `dst`, every weight changed (as a further fine-tune would)."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    tensors = load_file(dst / "model.safetensors")
    save_file({k: v * 1.01 + 1e-3 for k, v in tensors.items()}, dst / "model.safetensors")


@pytest.mark.slow  # 1-step LoRA run, resumes, a 2nd step: 157 s on 2 loaded cores (122 s at 1 step)
def test_a_lora_run_is_resumed_and_exported_only_onto_its_own_base(tmp_path, capsys, caplog):
    register_test_rewards()
    base, run = tmp_path / "base", tmp_path / "run"
    shutil.copytree(builtin_checkpoint(), base)
    on_base = lambda path: f"PolicyConfig.checkpoint = '{path}'"
    assert _train(run, *LORA, on_base(base)) == 0
    saved = json.loads((run / "checkpoints" / "1" / "extra" / "metadata").read_text())
    assert saved["base"]["checkpoint"] == str(base), saved["base"]
    capsys.readouterr()

    # The base folder's weights changed in place (a further fine-tune saved over it).
    original = tmp_path / "original"
    shutil.copytree(base, original)
    _perturbed_copy(original, base)
    assert _train(run, *LORA, on_base(base), resume=True) == 2
    line = _one_line(capsys, "train")
    assert "not the base this run was trained on" in line and str(base) in line, line
    assert saved["base"]["fingerprint"] in line, line
    assert _export(run, tmp_path / "out") == 2
    line = _one_line(capsys, "export")
    assert "not the base this run was trained on" in line and saved["base"]["fingerprint"] in line

    # Another quantisation of the same base (int8 as read) is another base for the adapters.
    shutil.rmtree(base)
    shutil.copytree(original, base)
    int8 = 'LoraConfig.quantize_base = "int8"'
    assert _train(run, *LORA, int8, on_base(base), resume=True) == 2
    line = _one_line(capsys, "train")
    assert "quantize_base" in line and "'none'" in line and "'int8'" in line, line

    # The same base moved to another folder: compared by content, it resumes, trains step 2
    # on the moved base (its checkpoint records the new folder, the same weights) and exports.
    moved = tmp_path / "moved"
    shutil.move(base, moved)
    two_steps = "RLConfig.steps = 2"
    assert _train(run, *LORA, on_base(moved), two_steps, resume=True) == 0
    trained = [r["step"] for r in read_metrics(run) if "actor/grad_norm" in r]
    assert trained[-1] == 2 and trained.count(2) == 1, trained
    meta = run / "checkpoints" / "2" / "extra" / "metadata"
    assert json.loads(meta.read_text())["base"] == {**saved["base"], "checkpoint": str(moved)}
    assert _export(run, tmp_path / "out") == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()

    # A checkpoint saved before bases were recorded: resumes and exports, with a warning.
    old = json.loads(meta.read_text())
    del old["base"]
    meta.write_text(json.dumps(old))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _export(run, tmp_path / "out_old", fmt="peft") == 0
        assert _train(run, *LORA, on_base(moved), two_steps, resume=True) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("records no base" in w for w in warnings) == 2, warnings

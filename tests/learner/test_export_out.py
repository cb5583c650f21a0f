"""`jaxrl-llm export --out`: a folder that holds a model is refused unless `--overwrite`, which
removes the old model's files first (a stale sharded index, PEFT adapter or
generation_config.json would be read instead of, or with, the new model), also on gs://; an
--out that is a file, or that cannot be written, ends the command with one line."""

import json

import numpy as np
import pytest
from flax import nnx

from jaxrl_llm import cli
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.learner import export
from jaxrl_llm.learner.commands import OutDirInUseError
from jaxrl_llm.models import from_pretrained, save_pretrained
from jaxrl_llm.testing import register_test_rewards

from ..test_cloud_paths import fake_gcs
from .rl_helpers import TINY_RL_PARAMS

ERROR = "jaxrl-llm export: configuration error: "


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith(ERROR), err[-1]
    return err[-1]


def _export(run_dir, out, *extra):
    return cli.main(["export", "--run", str(run_dir), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 1-step run of the shipped model (its hf/ is checkpoint 1's policy)."""
    register_test_rewards()
    run_dir = tmp_path_factory.mktemp("export_out") / "run"
    argv = ["train", "--gin_file", "base.gin", "--run_dir", str(run_dir)]
    for p in [*TINY_RL_PARAMS, "RLConfig.steps = 1", "RLConfig.save_every = 1"]:
        argv += ["--gin_param", p]
    assert cli.main(argv) == 0
    return run_dir


def _stale_export(out):
    """A folder holding an earlier export: sharded, with a PEFT adapter and sampling defaults."""
    out.mkdir()
    index = {
        "metadata": {},
        "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"},
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (out / name).write_bytes(b"old shard")
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    (out / "adapter_model.safetensors").write_bytes(b"old adapter")
    (out / "generation_config.json").write_text(json.dumps({"temperature": 0.1}))
    (out / "notes.txt").write_text("the user's")


def _no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr("jaxrl_llm.models.from_pretrained", refuse)


@pytest.mark.slow  # one 1-step run (15 s), exports of it (5 s each)
def test_an_out_holding_a_model_is_replaced_only_with_overwrite(run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    _stale_export(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with monkeypatch.context() as m:
        _no_model_load(m)
        assert _export(run, out) == 2
    line = _one_line(capsys)
    assert str(out) in line and "--overwrite" in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    assert _export(run, out, "--overwrite") == 0
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.startswith(("adapter_", "model-", "generation_config"))], (
        names
    )
    assert "model.safetensors.index.json" not in names and "notes.txt" in names, names
    assert (out / "model.safetensors").read_bytes() == (
        run / "hf" / "model.safetensors"
    ).read_bytes()


def test_overwrite_removes_an_earlier_models_config_and_keeps_other_files(tmp_path):
    """A PEFT adapter written over a merged model must not leave the merged model's
    config.json: the folder would read as a full model without weights."""
    out = tmp_path / "out"
    _stale_export(out)
    (out / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (out / "model.safetensors").write_bytes(b"old merged weights")
    (out / "tokenizer.json").write_text("{}")
    export._remove_old_model(export.epath.Path(out))
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "tokenizer.json"]


@pytest.mark.slow
def test_an_out_that_is_a_file_or_cannot_be_written_ends_with_one_line(
    run, tmp_path, capsys, monkeypatch
):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    with monkeypatch.context() as m:
        _no_model_load(m)
        assert _export(run, a_file) == 2
    line = _one_line(capsys)
    assert f"--out {str(a_file)!r}" in line and "file" in line, line
    assert a_file.read_text() == "x"
    assert _export(run, a_file / "sub") == 2  # its parent is a file: the write fails
    line = _one_line(capsys)
    assert f"--out {str(a_file / 'sub')!r}" in line, line


def test_a_gcs_folder_holding_a_model_is_refused_without_overwrite(tmp_path):
    (tmp_path / "b" / "out").mkdir(parents=True)
    (tmp_path / "b" / "out" / "config.json").write_text("{}")
    with fake_gcs(tmp_path):
        with pytest.raises(OutDirInUseError, match="--overwrite"):
            export.check_out("gs://b/out", overwrite=False)
        export.check_out("gs://b/out", overwrite=True)
        export.check_out("gs://b/empty", overwrite=False)


def test_a_gcs_export_over_a_sharded_one_leaves_no_stale_index(tmp_path):
    """On gs:// the model is written in a local folder first, so only a removal in the bucket
    itself drops the earlier export's index, which readers prefer to model.safetensors."""
    old, new = from_pretrained(builtin_checkpoint()), from_pretrained(builtin_checkpoint())
    state = nnx.state(new, nnx.Param)
    for _, v in nnx.to_flat_state(state):  # a visibly different model
        v.set_value(v.get_value() + 1.0)
    nnx.update(new, state)
    out = tmp_path / "b" / "out"
    with fake_gcs(tmp_path):
        sharded = lambda p: save_pretrained(old, p, max_shard_bytes=200_000)
        export._write_via_local("gs://b/out", sharded)
        assert (out / "model.safetensors.index.json").is_file()
        export.save_pretrained_to(new, "gs://b/out")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "model.safetensors"], names
    loaded = nnx.to_flat_state(nnx.state(from_pretrained(out), nnx.Param))
    expected = nnx.to_flat_state(nnx.state(new, nnx.Param))
    assert [path for path, _ in loaded] == [path for path, _ in expected]
    for (path, a), (_, b) in zip(loaded, expected):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), path)

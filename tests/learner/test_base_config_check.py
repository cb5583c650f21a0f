"""Every run's checkpoint records the model config of its base (`base_identity`'s "config"),
and a resume of any run, full ones included, refuses a base whose model config changed (a
full run's checkpoint holds its weights, not the config they are computed with), naming the
fields. Built with the `Checkpointer` directly (no model is loaded)."""

import dataclasses
import json
import logging
import shutil

import jax.numpy as jnp
import pytest

from jaxrl_llm.learner.checkpoint import Checkpointer, base_identity
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.run import _open_checkpoints
from jaxrl_llm.models.config import CheckpointError


def _cfg(run_dir, base):
    cfg = RLConfig(run_dir=str(run_dir))
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, checkpoint=str(base)))


def _edit_config(base, **changes):
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, **changes}))


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_full_run_is_not_resumed_onto_a_base_whose_model_config_changed(
    tmp_path, caplog, builtin_copy
):
    base, run_dir = builtin_copy, tmp_path / "run"
    cfg = _cfg(run_dir, base)
    assert cfg.policy.lora is None and not cfg.needs_reference  # a full run, no KL term
    writer = Checkpointer(run_dir / "checkpoints")
    writer.base = base_identity(base, cfg.policy)
    writer.save(3, {"w": jnp.zeros(2)}, {"data": {}, "step": 3})
    writer.close()

    _edit_config(base, rope_theta=500000.0, max_position_embeddings=2048)
    with pytest.raises(CheckpointError) as error:
        _open_checkpoints(cfg, run_dir, resume=True)
    message = str(error.value)
    assert "rope_theta" in message and "max_position_embeddings" in message, message
    assert "10000.0" in message and "500000.0" in message, message
    assert str(run_dir / "checkpoints" / "3") in message and "\n" not in message, message

    # The same model spelt otherwise (transformers 5's rope_parameters, other tool keys),
    # in another folder: the same model config, resumed.
    moved = tmp_path / "moved"
    shutil.move(base, moved)
    config = json.loads((moved / "config.json").read_text())
    del config["rope_theta"]
    config |= {"max_position_embeddings": 1024, "transformers_version": "5.0.0",
               "dtype": "bfloat16",
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}  # fmt: skip
    (moved / "config.json").write_text(json.dumps(config))
    ckpt, step = _open_checkpoints(_cfg(run_dir, moved), run_dir, resume=True)
    ckpt.close()
    assert step == 3

    # A checkpoint saved before model configs were recorded: resumed, with a warning.
    meta = run_dir / "checkpoints" / "3" / "extra" / "metadata"
    extra = json.loads(meta.read_text())
    del extra["base"]["config"]
    meta.write_text(json.dumps(extra))
    _edit_config(moved, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ckpt, step = _open_checkpoints(_cfg(run_dir, moved), run_dir, resume=True)
    ckpt.close()
    assert any("model config" in w for w in _warnings(caplog)), _warnings(caplog)

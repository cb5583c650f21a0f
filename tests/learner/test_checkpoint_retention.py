"""Retention and damaged metadata, on the `Checkpointer` directly (a tiny tree, no model):
`max_to_keep` counts complete steps only and never removes an incomplete step folder (nothing
damaged is removed: docs/quickstart.md), and a `state/_METADATA` of valid JSON in the wrong
shape is a damaged step, one `CheckpointError` line like any other."""

import shutil

import jax.numpy as jnp
import pytest

from jaxrl_llm.learner.checkpoint import Checkpointer
from jaxrl_llm.models.config import CheckpointError

STATE = {"policy": {"params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}}}


def _names(root):
    return sorted(p.name for p in root.iterdir())


def test_retention_keeps_the_latest_complete_steps_and_never_removes_an_incomplete_one(tmp_path):
    root = tmp_path / "checkpoints"
    writer = Checkpointer(root, max_to_keep=3)
    for step in (2, 3, 4):
        writer.save(step, STATE, {"step": step})
    writer.close()
    (root / "3" / "extra" / "metadata").unlink()  # a partial copy: incomplete, not a step
    shutil.copytree(root / "4", root / "6.damaged")  # moved aside as the docs advise
    writer = Checkpointer(root, max_to_keep=3)
    assert writer.all_steps() == [2, 4]
    writer.save(5, STATE, {"step": 5})
    # Three complete steps: 2 stays (Orbax counted the incomplete 3 and removed 2).
    assert writer.all_steps() == [2, 4, 5]
    assert _names(root) == ["2", "3", "4", "5", "6.damaged"]
    writer.save(6, STATE, {"step": 6})
    assert writer.all_steps() == [4, 5, 6]
    assert _names(root) == ["3", "4", "5", "6", "6.damaged"]  # 3 is left for the user
    writer.save(7, STATE, {"step": 7})
    assert _names(root) == ["3", "5", "6", "6.damaged", "7"]
    writer.close()


@pytest.mark.parametrize(
    "content", ["null", '{"tree_metadata": []}', '{"tree_metadata": 5}', "[]"]
)  # fmt: skip
def test_metadata_of_the_wrong_json_shape_is_a_damaged_step_in_one_line(tmp_path, content):
    root = tmp_path / "checkpoints"
    writer = Checkpointer(root)
    for step in (3, 6):
        writer.save(step, STATE, {"step": step})
    writer.close()
    (root / "6" / "state" / "_METADATA").write_text(content)
    reader = Checkpointer(root, read_only=True)
    try:
        for read in (lambda: reader.restore(6, STATE), lambda: reader.check_fits(6, STATE)):
            with pytest.raises(CheckpointError) as error:
                read()
            message = str(error.value)
            assert "\n" not in message, message
            assert str(root / "6") in message and "move it aside" in message, message
            assert "[3]" in message, message
    finally:
        reader.close()

"""A damaged checkpoint step is bad input: a visibly incomplete step folder is skipped with a
warning naming it, and one that cannot be read ends the restore with one `CheckpointError`
naming the folder and the fix, never Orbax's, TensorStore's or json's own error. Built with
the `Checkpointer` directly on a tiny tree (no model, no run)."""

import logging
import shutil

import jax.numpy as jnp
import pytest

from jaxrl_llm.learner.checkpoint import Checkpointer
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.run import RunDirInUseError, _open_checkpoints
from jaxrl_llm.models.config import CheckpointError

STATE = {"policy": {"params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}}}


def _saved(directory, *steps):
    writer = Checkpointer(directory)
    for step in steps:
        writer.save(step, STATE, {"data": {"step": step}, "step": step})
    writer.close()
    return directory


def _make_incomplete(step_dir, how):
    if how == "empty folder":
        shutil.rmtree(step_dir, ignore_errors=True)
        step_dir.mkdir()
    elif how == "no state/_METADATA":
        (step_dir / "state" / "_METADATA").unlink()
    else:  # "no extra"
        (step_dir / "extra" / "metadata").unlink()


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("how", ["empty folder", "no state/_METADATA", "no extra"])
def test_an_incomplete_latest_step_is_skipped_with_a_warning_naming_it(tmp_path, caplog, how):
    """Orbax lists every integer-named folder: an empty `6` was the latest step, and its
    restore a KeyError ('Unknown key: state')."""
    ckpt_dir = _saved(tmp_path / "checkpoints", 3, 6)
    _make_incomplete(ckpt_dir / "6", how)
    reader = Checkpointer(ckpt_dir, read_only=True)
    with caplog.at_level(logging.WARNING):
        assert reader.latest_step() == 3
        assert reader.all_steps() == [3]
    assert any(str(ckpt_dir / "6") in w and "incomplete" in w for w in _warnings(caplog))
    state, extra = reader.restore(3, STATE)
    assert state["policy"]["params"]["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert extra["step"] == 3
    reader.close()


def _corrupt(step_dir, how):
    if how == "zero-byte extra":
        (step_dir / "extra" / "metadata").write_bytes(b"")
    elif how == "extra not an object":
        (step_dir / "extra" / "metadata").write_text("[]")
    elif how == "zero-byte manifest":
        (step_dir / "state" / "manifest.ocdbt").write_bytes(b"")
    elif how == "zero-byte _METADATA":
        (step_dir / "state" / "_METADATA").write_bytes(b"")
    else:  # "truncated data": every data file of the state cut to 10 bytes
        for f in (step_dir / "state").rglob("d/*"):
            with open(f, "r+b") as handle:
                handle.truncate(10)


@pytest.mark.parametrize(
    "how",
    ["zero-byte extra", "extra not an object", "zero-byte manifest", "zero-byte _METADATA",
     "truncated data"],
)  # fmt: skip
def test_a_damaged_step_ends_each_read_with_one_line_naming_it_and_the_fix(tmp_path, how):
    ckpt_dir = _saved(tmp_path / "checkpoints", 3, 6)
    step_dir = ckpt_dir / "6"
    _corrupt(step_dir, how)
    reader = Checkpointer(ckpt_dir, read_only=True)
    reads = {
        "restore": lambda: reader.restore(6, STATE),
        "read_extra": lambda: reader.read_extra(6),
        "restore_raw": lambda: reader.restore_raw(6),
        "check_fits": lambda: reader.check_fits(6, STATE),
    }
    failed = []
    for name, read in reads.items():
        try:
            read()
        except CheckpointError as e:
            message = str(e)
            assert "\n" not in message, message
            assert str(step_dir) in message and "move it aside" in message, message
            assert "[3]" in message, message  # the complete steps left
            failed.append(name)
    assert "restore" in failed, failed  # the whole restore reads both items
    reader.close()


def _cfg(tmp_path):
    return RLConfig(run_dir=str(tmp_path))


def test_a_resume_past_an_incomplete_step_is_refused_naming_it_and_the_step_it_would_take(
    tmp_path, caplog
):
    """Resuming from step 3 past an incomplete `6` would fail at its first save onto 6, after
    the steps between (Orbax refuses a step it lists): refused now, naming the fix."""
    ckpt_dir = _saved(tmp_path / "checkpoints", 3)
    (ckpt_dir / "6").mkdir()
    with pytest.raises(CheckpointError) as error:
        _open_checkpoints(_cfg(tmp_path), tmp_path, resume=True)
    message = str(error.value)
    assert str(ckpt_dir / "6") in message and "move it aside" in message, message
    assert "step 3" in message, message
    assert (ckpt_dir / "6").is_dir()  # nothing removed

    # Without --resume, a folder of step folders is another run's, complete or not.
    shutil.rmtree(ckpt_dir / "3")
    with pytest.raises(RunDirInUseError):
        _open_checkpoints(_cfg(tmp_path), tmp_path, resume=False)

    # Moved aside, the resume takes step 3; an incomplete step older than it is only warned.
    _saved(ckpt_dir, 3)
    (ckpt_dir / "6").rename(tmp_path / "6.damaged")
    (ckpt_dir / "1").mkdir()
    with caplog.at_level(logging.WARNING):
        ckpt, step = _open_checkpoints(_cfg(tmp_path), tmp_path, resume=True)
    ckpt.close()
    assert step == 3
    assert any(str(ckpt_dir / "1") in w for w in _warnings(caplog)), _warnings(caplog)

"""The run's `Checkpointer`: a reader beside a live run leaves the trainer's save alone; a
saved tree that does not fit the state it is restored into is refused, naming the arrays."""

import jax.numpy as jnp
import pytest

from jaxrl_llm.learner.checkpoint import Checkpointer
from jaxrl_llm.models.config import CheckpointError


def test_a_read_only_checkpointer_leaves_a_save_in_progress_alone(tmp_path):
    """`jaxrl-llm export` opens a run's checkpoints read-only: a writer's manager removes
    every temporary folder when it opens (a killed run's leftovers), which beside a live run
    is the trainer's save in progress, failing it."""
    writer = Checkpointer(tmp_path)
    writer.save(1, {"w": jnp.arange(3.0)}, {"step": 1})
    in_flight = tmp_path / "2.orbax-checkpoint-tmp"  # how Orbax names a save being written
    (in_flight / "state").mkdir(parents=True)

    reader = Checkpointer(tmp_path, read_only=True)
    assert in_flight.is_dir()
    assert reader.latest_step() == 1 and reader.all_steps() == [1]
    state, extra = reader.restore(1, {"w": jnp.zeros(3)})
    assert state["w"].tolist() == [0.0, 1.0, 2.0] and extra == {"step": 1}

    # A writer (a run starting) removes it in the background, done by its first save: what
    # a read-only reader must not do beside a live run.
    Checkpointer(tmp_path).save(3, {"w": jnp.zeros(3)}, {"step": 3})
    assert not in_flight.exists()


def test_a_read_only_checkpointer_creates_nothing(tmp_path):
    reader = Checkpointer(tmp_path / "none", read_only=True)
    assert reader.latest_step() is None and not (tmp_path / "none").exists()


def test_a_tree_that_does_not_fit_is_refused_naming_the_arrays_that_differ(tmp_path):
    """Compared from Orbax's metadata by a manager that has not saved (a resuming process),
    before any array is read: Orbax's own error is a traceback of every differing subtree."""
    Checkpointer(tmp_path).save(
        1, {"policy": {"params": {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}}}, {"step": 1}
    )
    reader = Checkpointer(tmp_path, read_only=True)
    like = {"policy": {"params": {"w": jnp.zeros((2, 4)), "c": jnp.zeros(1)}}}
    with pytest.raises(CheckpointError) as error:
        reader.restore(1, like)
    message = str(error.value)
    assert message.startswith(f"checkpoint {tmp_path / '1'} does not fit this run (3 arrays")
    assert "policy/params/w: saved (2, 3), expected (2, 4)" in message
    assert "policy/params/c: not in the checkpoint (expected (1,))" in message
    assert "policy/params/b: saved (3,), not in this run" in message

    # The same paths and shapes fit, in another dtype too (a restore casts); `under` checks
    # a subtree alone (the export's params).
    fits = {"w": jnp.zeros((2, 3), jnp.bfloat16), "b": jnp.zeros(3)}
    state, _ = reader.restore(1, {"policy": {"params": fits}})
    assert state["policy"]["params"]["w"].dtype == jnp.bfloat16
    reader.check_fits(1, fits, under="policy/params")
    with pytest.raises(CheckpointError, match="policy/params/w: saved"):
        reader.check_fits(1, {"w": jnp.zeros(6), "b": jnp.zeros(3)}, under="policy/params")

"""The run's `Checkpointer`: a reader beside a live run leaves the trainer's save alone."""

import jax.numpy as jnp

from jaxrl_llm.learner.checkpoint import Checkpointer


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

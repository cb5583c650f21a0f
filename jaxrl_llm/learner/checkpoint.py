"""Orbax checkpoints of a whole RL run: train states, RNG keys, data-iterator state, step.

Layout: `run_dir/checkpoints/<step>/{state, extra}`. `state` is a pytree of arrays (policy
and critic `TrainState`s, raw uint32 RNG keys) saved with `StandardSave`; `extra` is JSON
(data iterator state, host-side RNG state, counters). Orbax writes each step to a temporary
directory and renames it only when complete, so a run killed mid-write leaves nothing that
`latest_step` would pick up; leftovers are cleaned at the next start.
Every process must call `save`/`restore` (collective in multi-host runs).
The directory may be on `gs://`: Orbax reads and writes it through `etils.epath` and
TensorStore; a local directory is made absolute first.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

log = logging.getLogger(__name__)


def checkpoint_directory(directory: str | os.PathLike) -> epath.Path:
    """`directory` for Orbax: a URI (`gs://...`) as given, a local path made absolute."""
    path = epath.Path(directory)
    return path if "://" in os.fspath(path) else path.absolute()


class Checkpointer:
    """A run's checkpoints. `read_only`: for a reader beside a live run (`jaxrl-llm export`):
    it neither creates the folder nor removes temporary folders, one of which may be the
    trainer's save in progress (a writer cleans up leftovers of a killed run at its start)."""

    def __init__(
        self, directory: str | os.PathLike, *, max_to_keep: int | None = 3, read_only: bool = False
    ):
        self.directory = checkpoint_directory(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else max_to_keep,
            create=not read_only,
            cleanup_tmp_directories=not read_only,
            read_only=read_only,
            enable_async_checkpointing=False,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "extra")
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, extra: dict[str, Any]) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(extra)
            ),
            force=True,
        )
        self._manager.wait_until_finished()
        log.info("saved checkpoint %s/%d", self.directory, step)

    def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """Restore `step` into the shapes, dtypes and shardings of `like` (a pytree of arrays)."""
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
        )
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), extra=ocp.args.JsonRestore()
            ),
        )
        return out["state"], out["extra"]

    def restore_raw(self, step: int) -> dict[str, Any]:
        """The saved `state` tree as nested dicts of arrays, without a template."""
        out = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        return out["state"]

    def close(self) -> None:
        self._manager.close()

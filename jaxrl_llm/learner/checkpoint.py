"""Orbax checkpoints of a whole RL run: train states, RNG keys, data-iterator state, step.

Layout: `run_dir/checkpoints/<step>/{state, extra}`. `state` is a pytree of arrays (policy
and critic `TrainState`s, raw uint32 RNG keys) saved with `StandardSave`; `extra` is JSON
(data iterator state, host-side RNG state, counters). Orbax writes each step to a temporary
directory and renames it only when complete, so a run killed mid-write leaves nothing that
`latest_step` would pick up; leftovers are cleaned at the next start.
Every process must call `save`/`restore` (collective in multi-host runs).
The directory may be on `gs://`: Orbax reads and writes it through `etils.epath` and
TensorStore; a local directory is made absolute first.

Two checks keep a checkpoint on the run it belongs to, each ending the command with one line
(a `CheckpointError`) instead of a wrong model or Orbax's traceback:
- `restore` compares the saved arrays' paths and shapes (Orbax's metadata, no array read)
  with the state it restores into, and names the first that differ.
- `extra["base"]` records the model a run's frozen weights come from (`base_identity`: the
  folder's content fingerprint and how it was loaded), which a LoRA run's checkpoint does
  not hold; `check_base` refuses a resume or an export onto another base.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from jaxrl_llm.models.config import CheckpointError, as_dtype
from jaxrl_llm.models.fingerprint import checkpoint_fingerprint

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
        handlers = {"state": ocp.StandardCheckpointHandler(), "extra": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )  # handlers named up front: a manager that has not saved reads the metadata too
        self.base: dict[str, str] | None = None  # `base_identity`, saved in every step's extra

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, extra: dict[str, Any]) -> None:
        if self.base is not None:
            extra = {**extra, "base": self.base}
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
        """Restore `step` into the shapes, dtypes and shardings of `like` (a pytree of arrays);
        a `CheckpointError` naming the arrays that differ if the saved tree does not fit it."""
        self.check_fits(step, like)
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

    def read_extra(self, step: int) -> dict[str, Any]:
        """Step `step`'s JSON `extra` alone (no array is read)."""
        out = self._manager.restore(step, args=ocp.args.Composite(extra=ocp.args.JsonRestore()))
        return out["extra"]

    def check_fits(self, step: int, like: Any, under: str = "") -> None:
        """Raise a `CheckpointError` unless the arrays saved at `step` (below the path
        `under`, e.g. 'policy/params') have the paths and shapes of `like`'s leaves. Read
        from Orbax's metadata; dtypes may differ (a restore casts)."""
        tree = self._manager.item_metadata(step)["state"]
        if tree is None:  # no metadata to compare: Orbax's own check stands
            return
        prefix = f"{under}/" if under else ""
        saved = {p: s for p, s in _shapes(tree).items() if p.startswith(prefix)}
        expected = {prefix + p: s for p, s in _shapes(like).items()}
        differ = _differences(saved, expected)
        if differ:
            n = sum(len(paths) for _, paths in differ)
            what = ", ".join(f"{len(p)} {kind} [{'; '.join(p[:3])}]" for kind, p in differ)
            raise CheckpointError(
                f"checkpoint {self.directory / str(step)} does not fit this run ({n} arrays "
                f"differ): {what}. Use the settings it was saved with (the model, "
                "PolicyConfig.lora and its rank and targets, the critic), or another run_dir"
            )

    def restore_raw(self, step: int) -> dict[str, Any]:
        """The saved `state` tree as nested dicts of arrays, without a template."""
        out = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        return out["state"]

    def close(self) -> None:
        self._manager.close()


def _shapes(tree: Any) -> dict[str, tuple[int, ...] | None]:
    """'/'-joined path -> shape of each leaf, in tree order, params first (the paths a user
    recognises). An nnx Variable's trailing 'value' is dropped; None: a leaf with no shape."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
        names = names[:-1] if names[-1:] == ["value"] else names
        shape = getattr(leaf, "shape", None)
        out["/".join(names)] = None if shape is None else tuple(shape)
    return dict(sorted(out.items(), key=lambda item: "/params/" not in item[0]))


def _differences(saved: dict, expected: dict) -> list[tuple[str, list[str]]]:
    """(kind, ['path: what differs', ...]) for each kind of difference between two
    `_shapes`, those with none left out."""
    shape = [f"{p}: saved {saved[p]}, expected {s}" for p, s in expected.items()
             if p in saved and None not in (s, saved[p]) and saved[p] != s]  # fmt: skip
    missing = [f"{p}: not in the checkpoint (expected {s})" for p, s in expected.items()
               if p not in saved]  # fmt: skip
    extra = [f"{p}: saved {s}, not in this run" for p, s in saved.items() if p not in expected]
    kinds = [("of another shape", shape), ("missing", missing), ("not in this run", extra)]
    return [(kind, paths) for kind, paths in kinds if paths]


def base_identity(checkpoint: str | os.PathLike, policy: Any) -> dict[str, str]:
    """What a run's frozen base is: the checkpoint folder (`PolicyConfig.checkpoint`,
    resolved), its content (`models.fingerprint`) and how it was loaded (the
    weights' dtype; with LoRA, `quantize_base`), for `check_base`. `policy`: a
    `PolicyConfig`."""
    lora = policy.lora
    return {
        "checkpoint": os.fspath(checkpoint),
        "fingerprint": checkpoint_fingerprint(checkpoint),
        "param_dtype": str(as_dtype(policy.param_dtype)),
        "quantize_base": "none" if lora is None else lora.quantize_base,
        "lora_alpha": "none" if lora is None else repr(float(lora.alpha)),
    }


# How the base was loaded, beside its content: the weights the adapters trained on.
_LOADED_AS = {
    "param_dtype": "PolicyConfig.param_dtype",
    "quantize_base": "LoraConfig.quantize_base",
    # Not the base, but what its adapters mean: (alpha / rank) A B. Another alpha rescales
    # the trained adapters silently (rank and targets change shapes: `check_fits` sees those).
    "lora_alpha": "LoraConfig.alpha",
}


def check_base(
    saved: dict[str, str] | None, current: dict[str, str], *, field: str, step_dir: str,
    loaded_as: bool, fix: str = "or start a new run_dir",
) -> None:  # fmt: skip
    """Refuse a base other than the one checkpoint `step_dir` recorded (`saved`: its
    `extra.get("base")`): another content, or with `loaded_as` another dtype or int8
    quantisation (the base the adapters trained on, as the trainer sees it). The same
    content in another folder is the same base. `field` names where `current` came from;
    `fix` ends the message after 'point <field> at that model'. A checkpoint saved before
    bases were recorded passes, with a warning."""
    here = f"{field} = {current['checkpoint']!r}"
    if saved is None:
        log.warning("checkpoint %s records no base model (saved before jaxrl-llm recorded "
                    "one): cannot check that %s is the base it was trained on; using it as "
                    "it is", step_dir, here)  # fmt: skip
        return
    if saved["fingerprint"] != current["fingerprint"]:
        raise CheckpointError(
            f"{here} (fingerprint {current['fingerprint']}) is not the base this run was "
            f"trained on: checkpoint {step_dir} records {saved['checkpoint']!r} (fingerprint "
            f"{saved['fingerprint']}); point {field} at that model (in any folder: it is "
            f"compared by content), {fix}"
        )
    for key, name in _LOADED_AS.items():
        if key == "lora_alpha" and "none" in (saved.get(key, "none"), current[key]):
            continue  # a run without adapters on one side: `check_fits` names the difference
        if loaded_as and saved.get(key, current[key]) != current[key]:
            raise CheckpointError(
                f"{name} = {current[key]!r}: checkpoint {step_dir} was trained with {name} = "
                f"{saved[key]!r} (the base its adapters trained on, as loaded, and their "
                f"scale); resume with {name} = {saved[key]!r}, or start a new run_dir"
            )
    if saved["checkpoint"] != current["checkpoint"]:
        log.info("base %r found at %s (same content)", saved["checkpoint"], here)

"""Orbax checkpoints of a whole RL run: train states, RNG keys, data-iterator state, step.

Layout: `run_dir/checkpoints/<step>/{state, extra}`. `state` is a pytree of arrays (policy
and critic `TrainState`s, raw uint32 RNG keys) saved with `StandardSave`; `extra` is JSON
(data iterator state, host-side RNG state, counters). Orbax writes each step to a temporary
directory and renames it only when complete, so a run killed mid-write leaves nothing that
`latest_step` would pick up; leftovers are cleaned at the next start.
Every process must call `save`/`restore` (collective in multi-host runs).
The directory may be on `gs://`: Orbax reads and writes it through `etils.epath` and
TensorStore; a local directory is made absolute first.

A damaged step is bad input, met with a warning or one line (a `CheckpointError`), and
nothing is removed: a step folder visibly incomplete (no `state/_METADATA` or no
`extra/metadata`, as a partial copy leaves it) is not a step (`all_steps`, `latest_step`
skip it, warning once); one that cannot be read (a truncated file, corrupt JSON) ends the
read naming the folder and the fix: move it aside, and the latest complete step before it
is taken. Retention (`max_to_keep`) keeps the latest complete steps and deletes older complete
ones after each save; an incomplete folder is neither counted nor removed.

Two checks keep a checkpoint on the run it belongs to, each ending the command with one line
(a `CheckpointError`) instead of a wrong model or Orbax's traceback:
- `restore` compares the saved arrays' paths and shapes (Orbax's metadata, no array read)
  with the state it restores into, and names the first that differ.
- `extra["base"]` records the model a run starts from (`base_identity`: the folder's content
  fingerprint, its model config and how it was loaded); `check_base` refuses a resume or an
  export onto another model config (any run: the checkpoint holds weights, not the config
  they are computed with), and onto another base where its weights are part of the run (a
  LoRA run's frozen base, which its checkpoint does not hold; a KL reference).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from jaxrl_llm.models.config import CheckpointError, as_dtype
from jaxrl_llm.models.fingerprint import checkpoint_fingerprint, model_config

log = logging.getLogger(__name__)


def checkpoint_directory(directory: str | os.PathLike) -> epath.Path:
    """`directory` for Orbax: a URI (`gs://...`) as given, a local path made absolute."""
    path = epath.Path(directory)
    return path if "://" in os.fspath(path) else path.absolute()


class Checkpointer:
    """A run's checkpoints. `read_only`: for a reader beside a live run (`jaxrl-llm export`):
    it neither creates the folder nor removes temporary folders, one of which may be the
    trainer's save in progress (a writer cleans up leftovers of a killed run at its start).
    `create`: make the folder if it is missing (a resume does not: it needs one)."""

    def __init__(
        self, directory: str | os.PathLike, *, max_to_keep: int | None = 3,
        read_only: bool = False, create: bool = True,
    ):  # fmt: skip
        self.directory = checkpoint_directory(directory)
        # Retention is ours (`_remove_old`): Orbax's would count incomplete step folders.
        self._max_to_keep = None if read_only else max_to_keep
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,
            create=create and not read_only,
            cleanup_tmp_directories=not read_only,
            read_only=read_only,
            enable_async_checkpointing=False,
        )
        handlers = {"state": ocp.StandardCheckpointHandler(), "extra": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )  # handlers named up front: a manager that has not saved reads the metadata too
        self.base: dict[str, Any] | None = None  # `base_identity`, saved in every step's extra
        self._warned: set[int] = set()  # incomplete steps already warned about

    def latest_step(self) -> int | None:
        """The latest complete step (`all_steps`); None: none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def all_steps(self) -> list[int]:
        """The complete steps, oldest first; each incomplete one (`incomplete_steps`) is left
        out with a warning naming it (once per step and checkpointer)."""
        incomplete = self.incomplete_steps()
        for step in sorted(set(incomplete) - self._warned):
            self._warned.add(step)
            log.warning("checkpoint %s is incomplete (no %s): skipped; move it aside (out of "
                        "%s) once it is not needed", self.directory / str(step),
                        incomplete[step], self.directory)  # fmt: skip
        return sorted(s for s in self._manager.all_steps() if s not in incomplete)

    def incomplete_steps(self) -> dict[int, str]:
        """Step -> the file it lacks, for each step folder that lacks one of `_COMPLETE`: not a
        step Orbax wrote whole (it renames a step into place only once written)."""
        out = {}
        for step in self._manager.all_steps():
            step_dir = self.directory / str(step)
            missing = [name for name in _COMPLETE if not (step_dir / name).exists()]
            if missing:
                out[step] = missing[0]
        return out

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
        self._remove_old()

    def _remove_old(self) -> None:
        """Keep the latest `max_to_keep` complete steps: older complete ones are deleted, an
        incomplete folder never (it is not a step; the user moves it aside). Collective, as
        Orbax's delete is: every process lists the same steps."""
        if self._max_to_keep is None:
            return
        steps = self.all_steps()
        for step in steps[: max(len(steps) - self._max_to_keep, 0)]:
            self._manager.delete(step)
            log.info("removed checkpoint %s/%d (max_to_keep %d)", self.directory, step,
                     self._max_to_keep)  # fmt: skip

    def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """Restore `step` into the shapes, dtypes and shardings of `like` (a pytree of arrays);
        a `CheckpointError` naming the arrays that differ if the saved tree does not fit it."""
        self.check_fits(step, like)
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
        )
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), extra=ocp.args.JsonRestore()
        )
        with self._reading(step):
            out = self._manager.restore(step, args=args)
            return out["state"], _json_object(out["extra"])

    def read_extra(self, step: int) -> dict[str, Any]:
        """Step `step`'s JSON `extra` alone (no array is read)."""
        args = ocp.args.Composite(extra=ocp.args.JsonRestore())
        with self._reading(step):
            return _json_object(self._manager.restore(step, args=args)["extra"])

    def check_fits(self, step: int, like: Any, under: str = "") -> None:
        """Raise a `CheckpointError` unless the arrays saved at `step` (below the path
        `under`, e.g. 'policy/params') have the paths and shapes of `like`'s leaves. Read
        from Orbax's metadata; dtypes may differ (a restore casts)."""
        with self._reading(step):
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
        args = ocp.args.Composite(state=ocp.args.StandardRestore())
        with self._reading(step):
            return self._manager.restore(step, args=args)["state"]

    @contextlib.contextmanager
    def _reading(self, step: int) -> Iterator[None]:
        """An error reading step `step` (Orbax's, TensorStore's, json's, the file system's)
        as one `CheckpointError` naming the step folder, what failed and the fix."""
        try:
            yield
        except CheckpointError:
            raise
        except (ValueError, OSError, KeyError, TypeError, AttributeError) as e:
            # AttributeError: Orbax's reader on JSON of another shape (`null` metadata).
            step_dir = self.directory / str(step)
            why = str(e).strip().splitlines()[0] if str(e).strip() else ""
            why = why.split(" [tensorstore_spec=")[0]  # TensorStore appends its whole spec
            why = why if len(why) <= 400 else why[:400] + "..."
            others = [s for s in self.all_steps() if s != step]
            then = (f"a resume or an export then takes the latest of the other complete steps "
                    f"{others}") if others else "there is no other complete step"  # fmt: skip
            raise CheckpointError(
                f"cannot read checkpoint {step_dir} ({type(e).__name__}: {why}); it is damaged: "
                f"move it aside (mv {step_dir} {step_dir}.damaged); {then}"
            ) from e

    def close(self) -> None:
        self._manager.close()


def nothing_to_resume(directory: epath.Path, incomplete: dict[int, str]) -> CheckpointError:
    """The error of a resume that finds no complete step in `directory` (a
    `checkpoint_directory`; `incomplete`: its `incomplete_steps`), naming what is there: a
    resume that started over instead would replace the run's metrics.jsonl and hf/."""
    names = sorted(p.name for p in directory.iterdir()) if directory.exists() else []
    aside = [n for n in names if not n.isdigit() and "orbax-checkpoint-tmp" not in n]
    found = []
    if incomplete:
        found.append(f"incomplete steps {sorted(incomplete)}")
    if aside:
        found.append(f"moved aside: {', '.join(aside)}")
    what = "; ".join(found) or ("no step" if directory.exists() else "no such folder")
    fix = "fix --run_dir (or RLConfig.run_dir), or drop --resume to start a new run"
    if found:  # starting over there would replace this run's metrics.jsonl and hf/
        fix = ("put a complete step back there, fix --run_dir (or RLConfig.run_dir), or start "
               "a new run in another run_dir")  # fmt: skip
    return CheckpointError(f"--resume: no complete checkpoint in {directory} ({what}): {fix}")


# What every step Orbax writes holds: the arrays' metadata and the JSON extra.
_COMPLETE = ("state/_METADATA", "extra/metadata")


def _json_object(extra: Any) -> dict[str, Any]:
    if not isinstance(extra, dict):
        raise TypeError(f"extra/metadata holds a JSON {type(extra).__name__}, not an object")
    return extra


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


def base_identity(checkpoint: str | os.PathLike, policy: Any) -> dict[str, Any]:
    """What a run's base is: the checkpoint folder (`PolicyConfig.checkpoint`, resolved),
    its content and model config (`models.fingerprint`) and how it was loaded (the weights'
    dtype; with LoRA, `quantize_base`), for `check_base`. `policy`: a `PolicyConfig`."""
    lora = policy.lora
    return {
        "checkpoint": os.fspath(checkpoint),
        "fingerprint": checkpoint_fingerprint(checkpoint),
        "config": model_config(checkpoint),
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
    saved: dict[str, Any] | None, current: dict[str, Any], *, field: str, step_dir: str,
    loaded_as: bool, weights: bool = True, fix: str = "or start a new run_dir",
) -> None:  # fmt: skip
    """Refuse a base other than the one checkpoint `step_dir` recorded (`saved`: its
    `extra.get("base")`): another model config (`_check_config`, every run); with `weights`
    (the base's weights are part of the run: a LoRA run's frozen base, a KL reference)
    another content, or with `loaded_as` another dtype or int8 quantisation (the base the
    adapters trained on, as the trainer sees it). The same content in another folder is the
    same base. `field` names where `current` came from; `fix` ends the message after
    'point <field> at that model'. A checkpoint saved before bases were recorded passes,
    with a warning."""
    here = f"{field} = {current['checkpoint']!r}"
    if saved is None:
        log.warning("checkpoint %s records no base model (saved before jaxrl-llm recorded "
                    "one): cannot check that %s is the base it was trained on; using it as "
                    "it is", step_dir, here)  # fmt: skip
        return
    _check_config(saved, current, here=here, field=field, step_dir=step_dir, weights=weights,
                  fix=fix)  # fmt: skip
    if not weights:
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
            # As gin takes it: alpha is recorded as the string repr(float(alpha)).
            now, then = (float(v) if key == "lora_alpha" else v for v in (current[key], saved[key]))
            raise CheckpointError(
                f"{name} = {now!r}: checkpoint {step_dir} was trained with {name} = {then!r} "
                f"(the base its adapters trained on, as loaded, and their scale); resume "
                f"with {name} = {then!r}, or start a new run_dir"
            )
    if saved["checkpoint"] != current["checkpoint"]:
        log.info("base %r found at %s (same content)", saved["checkpoint"], here)


def _check_config(
    saved: dict[str, Any], current: dict[str, Any], *, here: str, field: str, step_dir: str,
    weights: bool, fix: str,
) -> None:  # fmt: skip
    """Refuse a model config (`fingerprint.model_config`) other than the one `saved` records,
    naming the fields that differ: a full run's checkpoint holds its weights, not the config
    they are computed with (another rope_theta would continue silently). A record saved
    before configs were recorded passes; with `weights`, the fingerprint covers config.json."""
    if "config" not in saved:
        if not weights and saved["fingerprint"] != current["fingerprint"]:
            log.warning("checkpoint %s records no model config (saved before jaxrl-llm "
                        "recorded one) and %s is another folder content: cannot check that its "
                        "config is the one the run trained with; using it as it is", step_dir,
                        here)  # fmt: skip
        return
    old, new = saved["config"], current["config"]
    keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
    if keys:
        what = "; ".join(f"{k}: saved {old.get(k)!r}, now {new.get(k)!r}" for k in keys)
        raise CheckpointError(
            f"{here} is not the model this run was trained as: its config.json differs from "
            f"the one checkpoint {step_dir} records ({what}); restore those fields or point "
            f"{field} at the model it records ({saved['checkpoint']!r}), {fix}"
        )

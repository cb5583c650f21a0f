"""`jaxrl-llm export`: an RL run's policy (latest or given checkpoint) to HF safetensors.

The run directory and the output folder may be `gs://` paths (`etils.epath`);
`save_pretrained_to` is also how a finished run writes run_dir/hf. A LoRA run
(`PolicyConfig.lora`) exports either the merged model (`--format merged`: W + (alpha/r) A B,
a plain HF checkpoint) or a PEFT adapter folder (`--format peft`: `adapter_config.json` +
`adapter_model.safetensors`, loaded by `peft.PeftModel.from_pretrained` on the base); a
finished LoRA run writes both (run_dir/hf and run_dir/adapter). Both put the adapters on the
base's float weights, an int8 run's too (`LoraConfig.quantize_base`): the merged model is
what PEFT computes from the adapter folder on the original base, as QLoRA's adapters are
used, not the int8 rounding the run trained against.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import tempfile
from typing import Any

import jax
import numpy as np
from etils import epath
from flax import nnx

from jaxrl_llm.models.hf_files import INDEX_FILE
from jaxrl_llm.models.lora import adapters, projection_weights
from jaxrl_llm.models.stop_tokens import GENERATION_CONFIG

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, type=epath.Path, help="run directory")
    parser.add_argument("--out", required=True, type=epath.Path, help="output HF folder")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    parser.add_argument(
        "--format",
        choices=("merged", "peft"),
        default="merged",
        help="LoRA runs: merged HF weights, or a PEFT adapter folder (adapters only)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the model an existing --out holds (its config, weights, index, PEFT "
        "adapter and generation_config.json are removed first)",
    )


# Marks an --out that holds a model: an export there needs --overwrite.
_MODEL_MARKERS = ("config.json", "*.safetensors", "*.safetensors.index.json", "adapter_*")
# An earlier model's files, removed before a model is written: readers would take a stale
# sharded index over model.safetensors, or load an old adapter or sampling defaults with it,
# and a PEFT adapter written over a merged model would keep its config.json (a folder that
# reads as a full model without its weights).
_OLD_MODEL_FILES = (
    "config.json", "model*.safetensors", INDEX_FILE, "adapter_*", GENERATION_CONFIG,
)  # fmt: skip


def check_out(out: str | os.PathLike, *, overwrite: bool) -> None:
    """Before any model loads: a `ConfigError` when `out` is a file, an `OutDirInUseError`
    when it is a folder holding a model (`_MODEL_MARKERS`) and not `overwrite`."""
    from jaxrl_llm.config import ConfigError
    from jaxrl_llm.config_checks import OutDirInUseError

    out = epath.Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {os.fspath(out)!r} is a file: name a folder for the model")
    if overwrite or not out.is_dir():
        return
    held = sorted({p.name for pattern in _MODEL_MARKERS for p in out.glob(pattern)})
    if held:
        raise OutDirInUseError(
            f"--out {os.fspath(out)!r} already holds a model ({', '.join(held)}): pass "
            "--overwrite to replace it (its config, weights, index, PEFT adapter and "
            "generation_config.json are removed first), or choose another --out"
        )


def _remove_old_model(out: epath.Path) -> None:
    """Delete `_OLD_MODEL_FILES` in the folder `out` (local or gs://) before a model is
    written there; other files (a tokenizer, the user's notes) stay."""
    if not out.is_dir():
        return
    for pattern in _OLD_MODEL_FILES:
        for path in out.glob(pattern):
            path.unlink()


def save_pretrained_to(model: Any, out: str | os.PathLike, *, tokenizer: Any = None) -> None:
    """`models.save_pretrained` into `out`, also on `gs://`: safetensors and the tokenizer
    write local files, so a cloud folder is written locally first, then each file copied.
    Collective like `save_pretrained`: every process calls it; process 0 writes."""
    from jaxrl_llm.models import save_pretrained

    _write_via_local(out, lambda path: save_pretrained(model, path, tokenizer=tokenizer))


def save_peft_adapter(model: Any, out: str | os.PathLike, *, base_model: str) -> None:
    """A PEFT LoRA folder for `model`'s adapters (`peft_tensors`): what
    `peft.PeftModel.from_pretrained(<base_model loaded in transformers>, out)` reads."""
    from safetensors.numpy import save_file

    config, tensors = peft_config(model, base_model), peft_tensors(model)

    def write(path):
        if jax.process_index() != 0:
            return
        path = epath.Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, os.fspath(path / "adapter_model.safetensors"))

    _write_via_local(out, write)


def peft_tensors(model: nnx.Module) -> dict[str, np.ndarray]:
    """The adapters in PEFT's layout: `base_model.model.<HF module>.lora_A.weight` [r, in]
    and `lora_B.weight` [out, r], in and out flattened as HF's Linear weights are."""
    out = {}
    for ad in adapters(model):
        a, b = np.asarray(jax.device_get(ad.a), np.float32), np.asarray(jax.device_get(ad.b))
        r = a.shape[-1]
        prefix = "base_model.model." + ad.path.replace("/", ".")
        out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, r).T)
        out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b.astype(np.float32).reshape(r, -1).T)
    return out


def peft_config(model: nnx.Module, base_model: str) -> dict[str, Any]:
    """`adapter_config.json` for `peft.PeftModel.from_pretrained` (LoRA, causal LM)."""
    ads = list(adapters(model))
    if not ads:
        raise ValueError("the model has no LoRA adapters to export")
    rank = ads[0].a.shape[-1]
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": int(rank),
        "lora_alpha": float(ads[0].scale * rank),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "target_modules": peft_target_modules(model),
        "inference_mode": True,
    }


def peft_target_modules(model: nnx.Module) -> list[str] | str:
    """PEFT's `target_modules` for `model`'s adapters. PEFT takes a list as names matched in
    every layer, a str as a regular expression it full-matches against each module name
    (`peft.tuners.tuners_utils.check_target_module_exists`). Adapters on every weight of
    their names: those names; on some layers only: the exact module paths, as a pattern, so
    that PEFT builds no adapter that the folder lacks weights for."""
    adapted = {ad.path for ad in adapters(model)}
    names = sorted({path.rsplit("/", 1)[-1] for path in adapted})
    same_names = {path for _, name, path in projection_weights(model) if name in names}
    if adapted == same_names:
        return names
    return "|".join(re.escape(path.replace("/", ".")) for path in sorted(adapted))


def _write_via_local(out: str | os.PathLike, write) -> None:
    """`write(folder)` into `out`, an earlier model's files removed first
    (`_remove_old_model`); a `gs://` folder is written locally first (safetensors and
    tokenizers write local files), then each file copied (process 0)."""
    out = epath.Path(out)
    if "://" not in os.fspath(out):
        if jax.process_index() == 0:
            _remove_old_model(out)
        write(out)
        return
    with tempfile.TemporaryDirectory(prefix="jaxrl-hf-") as tmp:
        write(tmp)
        if jax.process_index() != 0:
            return
        _remove_old_model(out)
        for top, _, files in os.walk(tmp):
            dst = out / os.path.relpath(top, tmp)
            dst.mkdir(parents=True, exist_ok=True)
            for name in files:
                epath.Path(top, name).copy(dst / name, overwrite=True)


def export_final(model: Any, run_dir: Any, checkpoint: str, *, tokenizer: Any = None) -> None:
    """A finished run's policy: run_dir/hf (merged, with LoRA) and, with LoRA, also the
    adapters alone in run_dir/adapter (PEFT format, base = the resolved `checkpoint`). An
    int8 base is read again as float (`_float_base`) for the merge; `model` is left as it
    is."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.models.lora import has_adapters, has_int8_base, merge_adapters, on_float_weights

    run_dir = epath.Path(run_dir)
    if has_adapters(model):
        base = os.fspath(resolve_checkpoint(checkpoint))
        save_peft_adapter(model, run_dir / "adapter", base_model=base)
        if has_int8_base(model):
            model = on_float_weights(model, _float_base(base, model))
        model = merge_adapters(model)
    save_pretrained_to(model, run_dir / "hf", tokenizer=tokenizer)


def _float_base(checkpoint: str, model: Any) -> Any:
    """`checkpoint` loaded as `model` was (its config's dtypes and layer scan), without
    int8 quantisation, in the training layout on `model`'s mesh. This holds a float copy of
    the base beside the trainer's int8 one while the merge runs: the merged weights are
    float in any case."""
    from jax.sharding import Mesh, NamedSharding

    from jaxrl_llm.models import from_pretrained

    shardings = (getattr(x, "sharding", None) for x in jax.tree.leaves(nnx.state(model)))
    meshes = (s.mesh for s in shardings if isinstance(s, NamedSharding))
    mesh = next((m for m in meshes if isinstance(m, Mesh)), None)
    cfg = model.config
    return from_pretrained(checkpoint, dtype=cfg.dtype, param_dtype=cfg.param_dtype, mesh=mesh,
                           scan_layers=cfg.scan_layers)  # fmt: skip


def export_policy(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    step: int | None = None,
    fmt: str = "merged",
    *,
    overwrite: bool = False,
) -> int:
    """Write the policy of `run_dir`'s checkpoint `step` (latest if None) to `out`: HF
    safetensors (`fmt='merged'`; a LoRA run's adapters folded in) or, for a LoRA run, a
    PEFT adapter folder (`fmt='peft'`). The base must have the model config the run
    trained as, and a LoRA run's adapters go only onto the base they trained on
    (`checkpoint.check_base`, by content: the base may have moved). An `out` holding a model
    is refused before anything loads unless `overwrite` (`check_out`)."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.config import ConfigError
    from jaxrl_llm.learner.checkpoint import base_identity, check_base
    from jaxrl_llm.learner.lora import split_trainable
    from jaxrl_llm.models import from_pretrained, load_tokenizer
    from jaxrl_llm.models.lora import merge_adapters

    run_dir = epath.Path(run_dir)
    cfg = _run_config(run_dir)
    check_out(out, overwrite=overwrite)
    lora = cfg.policy.lora
    # The adapters go onto the float weights, an int8 run's too (as QLoRA's are used).
    on_float = None if lora is None else dataclasses.replace(lora, quantize_base="none")
    if fmt == "peft" and lora is None:
        raise ConfigError(f"--format peft: {run_dir} is not a LoRA run (PolicyConfig.lora = None)")
    field = f"{run_dir / 'config.gin'}: PolicyConfig.checkpoint"
    src = resolve_checkpoint(cfg.policy.checkpoint, field, tokenizer=fmt != "peft")
    ckpt, step = _open_step(run_dir, step)
    try:  # the exported config.json is the base's: it must be the one the run trained as
        check_base(
            ckpt.read_extra(step).get("base"),
            base_identity(src, cfg.policy),
            field=f"PolicyConfig.checkpoint in {run_dir / 'config.gin'}",
            step_dir=str(ckpt.directory / str(step)),
            loaded_as=False,  # the export merges into the float weights either way
            weights=lora is not None,  # a LoRA checkpoint's adapters merge onto their own base
            fix="then export again",
        )
        model = from_pretrained(src, dtype=cfg.policy.dtype, param_dtype=cfg.policy.param_dtype)
        graphdef, params, frozen, _ = split_trainable(model, on_float, seed=cfg.seed,
                                                      reference=False)  # fmt: skip
        ckpt.check_fits(step, params, under="policy/params")
        raw = _unwrap_variables(ckpt.restore_raw(step)["policy"]["params"])
    finally:
        ckpt.close()
    nnx.replace_by_pure_dict(params, jax.tree.map(np.asarray, raw))
    model = nnx.merge(graphdef, params, *(() if frozen is None else (frozen,)))
    if fmt == "peft":
        _write_out(out, lambda: save_peft_adapter(model, out, base_model=os.fspath(src)))
    else:
        if lora is not None:
            model = merge_adapters(model)
        _write_out(out, lambda: save_pretrained_to(model, out, tokenizer=load_tokenizer(src)))
    log.info("exported %s step %d to %s", run_dir, step, out)
    return step


def _write_out(out: str | os.PathLike, write: Any) -> None:
    """`write()`, an `OSError` of it (a parent that is a file, no permission, a full disk)
    as one `ConfigError` naming --out."""
    from jaxrl_llm.config import ConfigError

    try:
        write()
    except OSError as e:
        raise ConfigError(
            f"--out {os.fspath(out)!r}: cannot write the model there ({type(e).__name__}: "
            f"{e}); name a folder you can write"
        ) from e


def _run_config(run_dir: epath.Path) -> Any:
    """The `RLConfig` of the run in `run_dir` (its config.gin)."""
    from jaxrl_llm.config import ConfigError, parse_gin
    from jaxrl_llm.learner.rl_config import RLConfig

    if not (run_dir / "config.gin").is_file():
        what = "no config.gin in it" if run_dir.is_dir() else "no such folder"
        raise ConfigError(
            f"--run {str(run_dir)!r}: {what}; expected a jaxrl-llm run directory (the run_dir "
            "of `jaxrl-llm train`, with config.gin and checkpoints/); fix the path"
        )
    parse_gin([], [(run_dir / "config.gin").read_text()])  # gin's own reader is local-only
    return RLConfig()


def _open_step(run_dir: epath.Path, step: int | None) -> tuple[Any, int]:
    """The run's checkpoints, read-only (the run may be live), and `step` (None: the
    latest), which must be complete."""
    from jaxrl_llm.config import ConfigError
    from jaxrl_llm.learner.checkpoint import Checkpointer

    ckpt = Checkpointer(run_dir / "checkpoints", read_only=True)
    steps = ckpt.all_steps()
    step = ckpt.latest_step() if step is None else step
    if step is None or step not in steps:
        incomplete = sorted(ckpt.incomplete_steps())
        ckpt.close()
        flag = (
            "no complete checkpoint" if step is None else f"--step {step}: no complete checkpoint"
        )
        fix = f"pass --step with one of {steps}" if steps else "export after the first save"
        if incomplete and not steps:
            fix = f"steps {incomplete} are incomplete (the warnings say what each lacks)"
        raise ConfigError(f"--run {str(run_dir)!r}: {flag} in {ckpt.directory}; {fix}")
    return ckpt, step


def _unwrap_variables(tree):
    """Orbax stores each nnx Variable as {'value': array}; return the plain nested dict."""
    if isinstance(tree, dict):
        if set(tree) == {"value"}:
            return tree["value"]
        return {k: _unwrap_variables(v) for k, v in tree.items()}
    return tree


def main(args: argparse.Namespace) -> int:
    step = export_policy(args.run, args.out, args.step, args.format, overwrite=args.overwrite)
    print(f"exported step {step} to {args.out}")
    return 0

"""`jaxrl-llm export`: an RL run's policy (latest or given checkpoint) to HF safetensors.

The run directory and the output folder may be `gs://` paths (`etils.epath`);
`save_pretrained_to` is also how a finished run writes run_dir/hf.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from typing import Any

import jax
import numpy as np
from etils import epath
from flax import nnx

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, type=epath.Path, help="run directory")
    parser.add_argument("--out", required=True, type=epath.Path, help="output HF folder")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")


def save_pretrained_to(model: Any, out: str | os.PathLike, *, tokenizer: Any = None) -> None:
    """`models.save_pretrained` into `out`, also on `gs://`: safetensors and the tokenizer
    write local files, so a cloud folder is written locally first, then each file copied.
    Collective like `save_pretrained`: every process calls it; process 0 writes."""
    from jaxrl_llm.models import save_pretrained

    out = epath.Path(out)
    if "://" not in os.fspath(out):
        save_pretrained(model, out, tokenizer=tokenizer)
        return
    with tempfile.TemporaryDirectory(prefix="jaxrl-hf-") as tmp:
        save_pretrained(model, tmp, tokenizer=tokenizer)
        if jax.process_index() != 0:
            return
        for top, _, files in os.walk(tmp):
            dst = out / os.path.relpath(top, tmp)
            dst.mkdir(parents=True, exist_ok=True)
            for name in files:
                epath.Path(top, name).copy(dst / name, overwrite=True)


def export_policy(
    run_dir: str | os.PathLike, out: str | os.PathLike, step: int | None = None
) -> int:
    """Write the policy of `run_dir`'s checkpoint `step` (latest if None) to `out`."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.checkpoint import Checkpointer
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.models import from_pretrained, load_tokenizer

    run_dir = epath.Path(run_dir)
    if not (run_dir / "config.gin").is_file():
        raise FileNotFoundError(f"{run_dir} has no config.gin: not a jaxrl-llm run directory")
    parse_gin([], [(run_dir / "config.gin").read_text()])  # gin's own reader is local-only
    cfg = RLConfig()
    ckpt = Checkpointer(run_dir / "checkpoints")
    step = ckpt.latest_step() if step is None else step
    if step is None or step not in ckpt.all_steps():
        raise FileNotFoundError(
            f"no complete checkpoint {'' if step is None else step} in {ckpt.directory} "
            f"(have {ckpt.all_steps()})"
        )
    src = resolve_checkpoint(cfg.policy.checkpoint)
    model = from_pretrained(src, dtype=cfg.policy.dtype, param_dtype=cfg.policy.param_dtype)
    graphdef, params = nnx.split(model)
    raw = _unwrap_variables(ckpt.restore_raw(step)["policy"]["params"])
    nnx.replace_by_pure_dict(params, jax.tree.map(np.asarray, raw))
    save_pretrained_to(nnx.merge(graphdef, params), out, tokenizer=load_tokenizer(src))
    ckpt.close()
    log.info("exported %s step %d to %s", run_dir, step, out)
    return step


def _unwrap_variables(tree):
    """Orbax stores each nnx Variable as {'value': array}; return the plain nested dict."""
    if isinstance(tree, dict):
        if set(tree) == {"value"}:
            return tree["value"]
        return {k: _unwrap_variables(v) for k, v in tree.items()}
    return tree


def main(args: argparse.Namespace) -> int:
    step = export_policy(args.run, args.out, args.step)
    print(f"exported step {step} to {args.out}")
    return 0

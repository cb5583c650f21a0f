"""`jaxrl-llm export`: an RL run's policy (latest or given checkpoint) to HF safetensors."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import jax
import numpy as np
from flax import nnx

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, type=Path, help="run directory")
    parser.add_argument("--out", required=True, type=Path, help="output HF folder")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")


def export_policy(run_dir: Path, out: Path, step: int | None = None) -> int:
    """Write the policy of `run_dir`'s checkpoint `step` (latest if None) to `out`."""
    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.checkpoint import Checkpointer
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.models import from_pretrained, load_tokenizer, save_pretrained

    run_dir = Path(run_dir)
    if not (run_dir / "config.gin").is_file():
        raise FileNotFoundError(f"{run_dir} has no config.gin: not a jaxrl-llm run directory")
    parse_gin([run_dir / "config.gin"])
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
    save_pretrained(nnx.merge(graphdef, params), out, tokenizer=load_tokenizer(src))
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

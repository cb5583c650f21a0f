"""`jaxrl-llm train` (RL) and `jaxrl-llm sft`: parse gin flags, build the config, run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from jaxrl_llm.config import add_gin_arguments, parse_gin
from jaxrl_llm.config_checks import ConfigError, OutDirInUseError

if TYPE_CHECKING:
    from etils import epath

    from jaxrl_llm.learner.rl_config import MeshConfig

DEFAULT_TRAIN_GIN = "grpo_tiny.gin"


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    add_gin_arguments(parser)
    parser.add_argument(
        "--run_dir", default=None, help="run directory (default: runs/<name>-<timestamp>)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue from the latest complete checkpoint"
    )


def train_main(args: argparse.Namespace) -> int:
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.learner.rl_loop import run_rl
    from jaxrl_llm.sharding import initialize_distributed
    from jaxrl_llm.sharding.hosts import allgather_objects

    initialize_distributed()
    parse_gin(args.gin_file or [DEFAULT_TRAIN_GIN], args.gin_param)
    cfg = RLConfig()
    if args.run_dir:
        cfg = dataclasses.replace(cfg, run_dir=args.run_dir)
    elif args.resume and not cfg.run_dir:
        raise SystemExit("--resume needs --run_dir (or RLConfig.run_dir) naming the run")
    # Multi-host: the default run_dir has a timestamp; every host takes process 0's.
    cfg = dataclasses.replace(cfg, run_dir=allgather_objects(cfg.resolved_run_dir())[0])
    check_mesh(cfg.mesh)
    check_shared_run_dir(cfg.resolved_run_dir())  # process 0's, as set above
    print(f"run directory: {cfg.run_dir}", flush=True)
    t0 = time.perf_counter()
    records = run_rl(cfg, resume=args.resume)
    scores = [(r["step"], r["val/test_score"]) for r in records if "val/test_score" in r]
    summary = {"run_dir": cfg.run_dir, "wall_s": round(time.perf_counter() - t0, 1)}
    if scores:
        (s0, v0), (s1, v1) = scores[0], scores[-1]
        print(f"validation accuracy: step {s0} {100 * v0:.1f}% -> step {s1} {100 * v1:.1f}%")
        summary.update({f"val/test_score@{s0}": v0, f"val/test_score@{s1}": v1})
    print(json.dumps(summary))
    return 0


def check_mesh(m: MeshConfig) -> None:
    """`MeshConfig`'s shape against this run's devices (`devices` of them, the trainer's
    those `rollout_devices` leaves), a `ConfigError` before anything opens or loads. Several
    processes: the tensor axis within each host's devices, as `plan` checks it (each host
    samples on its own devices: `sharding.hosts.local_sampling_mesh`)."""
    import jax

    from jaxrl_llm.learner.plan_shapes import host_mesh_shape
    from jaxrl_llm.sharding.mesh import resolve_mesh_shape, run_device_count

    if jax.process_count() > 1 and m.devices != -1:  # the run's own check names it
        return
    trainer = run_device_count(m.devices, jax.device_count()) - m.rollout_devices
    if trainer <= 0:  # the run's own check names rollout_devices (`learner.run`)
        return
    _, _, tensor = resolve_mesh_shape(m.data, m.fsdp, m.tensor, num_devices=trainer)
    if jax.process_count() > 1 and not m.rollout_devices:  # else one process only (`run`)
        host_mesh_shape(jax.device_count(), jax.local_device_count(), tensor)


SHARED_CHECK_FILE = ".jaxrl-llm-shared-check"  # process 0's marker, removed at once


def check_shared_run_dir(run_dir: str) -> None:
    """Several processes: a `ConfigError` on every host unless each reads the marker process
    0 writes into `run_dir`, before anything else is written there. Orbax's multi-host save
    has process 0 make each checkpoint's folders and the others wait for them: on each
    host's own disk (a relative path on every TPU VM) they never appear, and the run would
    hang at its first save for Orbax's 10 minutes. One process: nothing to check or write."""
    import uuid

    import jax
    from etils import epath

    from jaxrl_llm.sharding import hosts

    if jax.process_count() == 1:
        return
    path = epath.Path(run_dir)
    marker = path / SHARED_CHECK_FILE
    token = error = None
    if jax.process_index() == 0:
        try:
            path.mkdir(parents=True, exist_ok=True)
            token = uuid.uuid4().hex
            marker.write_text(token)
        except Exception as e:  # any kind (gcsfs's are not all OSError): every host must stop
            error = f"{type(e).__name__}: {e}"
    token, error = hosts.allgather_objects((token, error))[0]  # written before this
    if error is not None:
        raise ConfigError(
            f"run_dir {run_dir}: process 0 cannot write there ({error}); give --run_dir (or "
            "RLConfig.run_dir) a folder every host can write, a gs:// path or a shared one"
        )
    seen = hosts.allgather_objects(_read_marker(marker) == token)  # read before removing
    if jax.process_index() == 0:
        marker.unlink()
    blind = [str(p) for p, ok in enumerate(seen) if not ok]
    if blind:
        raise ConfigError(
            f"run_dir {run_dir} is not shared by every host: process{'es' * (len(blind) > 1)} "
            f"{', '.join(blind)} cannot read the file process 0 wrote there, and a multi-host "
            "checkpoint needs every host to see process 0's folders; every host must share the "
            "run directory: give --run_dir (or RLConfig.run_dir) a gs:// path or a shared "
            "filesystem's folder"
        )


def _read_marker(marker: epath.Path) -> str | None:
    try:
        return marker.read_text()
    except Exception:  # not there (another disk) or not readable: not shared either way
        return None


def add_overwrite_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="train again into an out_dir that already holds a trained model (hf/), replacing it",
    )


def refuse_finished_out_dir(out_dir: str, field: str, *, overwrite: bool = False) -> None:
    """Raise `OutDirInUseError` when `out_dir` already holds a trained model (`hf/`), unless
    `overwrite`: a second run there would replace that model and its config.gin. `field`:
    the setting that named the folder (`SFTConfig.out_dir`, `RMConfig.out_dir`)."""
    if not overwrite and (Path(out_dir) / "hf").exists():
        raise OutDirInUseError(
            f"{field} {out_dir} already holds a trained model ({Path(out_dir) / 'hf'}): pass "
            f"--overwrite to replace it, or choose another out_dir ({field})"
        )


def add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    add_gin_arguments(parser)
    add_overwrite_argument(parser)


def sft_main(args: argparse.Namespace) -> int:
    from jaxrl_llm.learner.sft import SFTConfig, run_sft

    parse_gin(args.gin_file, args.gin_param)
    cfg = SFTConfig()
    refuse_finished_out_dir(cfg.out_dir, "SFTConfig.out_dir", overwrite=args.overwrite)
    print(json.dumps(run_sft(cfg)))  # writes out_dir/config.gin once its inputs are checked
    return 0

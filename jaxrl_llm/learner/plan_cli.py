"""`jaxrl-llm plan`: the command, and the single-setting changes it suggests when a run does
not fit. The memory model itself is `learner.plan`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.plan import GB, Plan, Workload, plan_memory
from jaxrl_llm.learner.plan_shapes import SHAPES, model_config


def suggest(cfg, mesh_shape, w: Workload, plan: Plan, **kw) -> list[dict]:
    """Single-setting changes (as gin bindings) and the peak each gives, best first."""
    d, f, t = mesh_shape
    options: list[tuple[str, Any, tuple, Workload]] = []
    if not cfg.remat:
        options.append(("PolicyConfig.remat=True", cfg.replace(remat=True), mesh_shape, w))
    rows = d * f
    if w.micro_batch % rows:  # rows not divisible over the devices are replicated
        mb = rows * max(w.micro_batch // rows, 1)
        ww = dataclasses.replace(
            w, micro_batch=mb, micro_batches=max(w.micro_batches * w.micro_batch // mb, 1)
        )
        options.append((f"AlgoConfig.micro_batch_size={mb}", cfg, mesh_shape, ww))
    elif w.micro_batch > 1:
        mb = w.micro_batch // 2
        change = f"AlgoConfig.micro_batch_size={mb}"
        ww = dataclasses.replace(w, micro_batch=mb, micro_batches=w.micro_batches * 2)
        options.append((change, cfg, mesh_shape, ww))
    if d > 1:
        options.append((f"MeshConfig.data={d // 2} (fsdp={f * 2})", cfg, (d // 2, f * 2, t), w))
    per_host = kw.get("devices_per_host")
    if f > 1 and (not per_host or per_host % (t * 2) == 0):  # tensor stays within a host
        options.append((f"MeshConfig.tensor={t * 2} (fsdp={f // 2})", cfg, (d, f // 2, t * 2), w))
    options += [(change, cfg, mesh_shape, ww) for change, ww in _scorer_options(w, cfg.dtype)]
    if w.sampler_weights == "same" and plan.terms["rollout_weights"]:  # a copy already
        ww = dataclasses.replace(w, sampler_weights="int8")
        options.append(('RolloutConfig.weights="int8"', cfg, mesh_shape, ww))
    if w.slots > 1 and w.backend != "vllm":
        ww = dataclasses.replace(w, slots=w.slots // 2)
        options.append((f"RolloutConfig.max_slots={w.slots // 2}", cfg, mesh_shape, ww))
    out = []
    for change, c, m, ww in options:
        p = plan_memory(c, m, ww, device_memory=plan.device_memory, **kw)
        out.append({"change": change, "peak": p.peak, "fits": bool(p.fits)})
    return sorted(out, key=lambda s: s["peak"])


def _scorer_options(w: Workload, compute_dtype: str) -> list[tuple[str, Workload]]:
    """Reward models and judges in bfloat16 (half their bytes), and half an RM's rows."""
    out = []
    for kind, owner in (("rm", "RewardModelConfig"), ("judge", "JudgeConfig")):
        mine = lambda s, kind=kind: s.kind == kind
        dtype = lambda s: compute_dtype if s.dtype == "auto" else s.dtype
        if any(mine(s) and dtype(s) == "float32" for s in w.scorers):
            halved = [dataclasses.replace(s, dtype="bfloat16") if mine(s) else s for s in w.scorers]
            change = f'{owner}.dtype="bfloat16"'
            out.append((change, dataclasses.replace(w, scorers=tuple(halved))))
    rows = max((s.rows for s in w.scorers if s.kind == "rm"), default=1)
    if rows > 1:
        fewer = [dataclasses.replace(s, rows=min(s.rows, rows // 2)) if s.kind == "rm" else s
                 for s in w.scorers]  # fmt: skip
        change = f"RewardModelConfig.batch_size={rows // 2}"
        out.append((change, dataclasses.replace(w, scorers=tuple(fewer))))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jaxrl_llm.config import add_gin_arguments

    add_gin_arguments(parser)
    parser.add_argument("--devices", type=int, required=True, help="devices in the mesh")
    parser.add_argument(
        "--device-memory-gb",
        type=float,
        default=None,
        help="memory per device (default: what the local device reports)",
    )
    parser.add_argument(
        "--devices-per-host",
        type=int,
        default=None,
        help="devices each process drives (default: all of --devices, one process); fewer "
        "plans a multi-host run, each host's sampler and scorers on its own devices "
        "(TPU pod slices: 4 or 8 chips per host)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help=f"plan this checkpoint instead: a path or one of {sorted(SHAPES)}",
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")


def _local_device_memory() -> float | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return float(stats["bytes_limit"]) if "bytes_limit" in stats else None


def main(args: argparse.Namespace) -> int:
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.sharding.mesh import resolve_mesh_shape

    parse_gin(args.gin_file or ["grpo_tiny.gin"], args.gin_param)
    rl = RLConfig()
    p = rl.policy
    checkpoint = args.model or p.checkpoint
    numerics = dict(dtype=p.dtype, param_dtype=p.param_dtype, remat=p.remat)
    cfg = model_config(checkpoint, **numerics)
    m = rl.mesh
    if m.rollout_devices >= args.devices:
        raise ConfigError(
            f"MeshConfig.rollout_devices = {m.rollout_devices} leaves none of the "
            f"{args.devices} devices to the trainer"
        )
    per_host = args.devices_per_host
    if m.rollout_devices and per_host and per_host < args.devices:
        raise ConfigError(
            f"MeshConfig.rollout_devices = {m.rollout_devices} runs on one process only so "
            f"far (--devices-per-host={per_host} of {args.devices} is several); use 0 for "
            "multi-host runs"
        )
    # The trainer's mesh takes the devices the sampler's do not (`learner.run._meshes`).
    trainer = args.devices - m.rollout_devices
    mesh_shape = resolve_mesh_shape(m.data, m.fsdp, m.tensor, num_devices=trainer)
    w = Workload.from_rl_config(rl)
    memory = args.device_memory_gb * GB if args.device_memory_gb else _local_device_memory()
    kw = dict(name=checkpoint, devices_per_host=per_host)
    plan = plan_memory(cfg, mesh_shape, w, device_memory=memory, **kw)
    if plan.fits is False:
        plan.suggestions = suggest(cfg, mesh_shape, w, plan, **kw)
    if not args.json:
        print(plan.table())
    print(json.dumps(plan.to_json()))
    return 0 if plan.fits is not False else 1

"""`jaxrl-llm plan`: the command, and the single-setting changes it suggests when a run does
not fit. The memory model itself is `learner.plan`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import numpy as np

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner.plan import GB, Plan, Workload, plan_memory
from jaxrl_llm.learner.plan_shapes import SHAPES, host_mesh_shape, model_config


def suggest(cfg, mesh_shape, w: Workload, plan: Plan, **kw) -> list[dict]:
    """Single-setting changes (as gin bindings) and the peak each gives, best first."""
    d, f, _ = mesh_shape
    options: list[tuple[str, Any, tuple, Workload]] = []
    if not cfg.remat:
        options.append(("PolicyConfig.remat=True", cfg.replace(remat=True), mesh_shape, w))
    mb = _smaller_micro_batch(w, rows=d * f)
    if mb is not None:
        mini = w.micro_batch * w.micro_batches
        ww = dataclasses.replace(w, micro_batch=mb, micro_batches=mini // mb)
        options.append((f"AlgoConfig.micro_batch_size={mb}", cfg, mesh_shape, ww))
    options += [(c, cfg, m, w) for c, m in _mesh_options(mesh_shape, kw.get("devices_per_host"))]
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


def _mesh_options(mesh_shape, per_host: int | None) -> list[tuple[str, tuple[int, int, int]]]:
    """Meshes over the same devices with more of them on fsdp (taken from data) or on
    tensor (taken from fsdp): the smallest factor of the axis moved that `train` builds
    (`_buildable`); an odd axis moves whole (data=3 -> data=1, fsdp x 3), not halved."""
    d, f, t = mesh_shape
    factors = lambda n: [k for k in range(2, n + 1) if n % k == 0]
    moves = (
        ([(d // k, f * k, t) for k in factors(d)], "MeshConfig.data={0} (fsdp={1})"),
        ([(d, f // k, t * k) for k in factors(f)], "MeshConfig.tensor={2} (fsdp={1})"),
    )
    out = []
    for shapes, label in moves:
        shape = next((s for s in shapes if _buildable(s, mesh_shape, per_host)), None)
        if shape is not None:
            out.append((label.format(*shape), shape))
    return out


def _buildable(shape, current, per_host: int | None) -> bool:
    """Whether `train` builds `shape` where it would build `current`: the mesh resolver's
    rule over the same devices, and with several hosts each host's sampling mesh."""
    from jaxrl_llm.sharding.mesh import resolve_mesh_shape

    devices = int(np.prod(current))
    try:
        resolve_mesh_shape(*shape, num_devices=devices)
        if per_host and per_host < devices:  # several processes (`plan_memory`)
            host_mesh_shape(devices, per_host, shape[2])
    except ConfigError:
        return False
    return True


def _smaller_micro_batch(w: Workload, rows: int) -> int | None:
    """The micro-batch size to suggest, one `train` accepts (a divisor of the mini-batch,
    micro_batch x micro_batches rows): when the micro-batch does not split over the `rows`
    (data x fsdp) devices (each then runs all of it), the largest multiple of `rows` up to
    it (or `rows`); else the largest up to half of it. None: no such size."""
    mini = w.micro_batch * w.micro_batches
    if w.micro_batch % rows:  # rows not divisible over the devices are replicated
        target = rows * max(w.micro_batch // rows, 1)
        sizes = [k for k in range(target, 0, -1) if k % rows == 0]
    else:
        sizes = list(range(w.micro_batch // 2, 0, -1))
    return next((k for k in sizes if _trains_with(w, k, mini)), None)


def _trains_with(w: Workload, micro_batch: int, mini: int) -> bool:
    """Whether `train` takes `AlgoConfig.micro_batch_size = micro_batch` for this batch: the
    rule `RLConfig.validate` applies (`experience.micro_batch_rows`)."""
    from jaxrl_llm.learner.experience import micro_batch_rows

    batch = w.samples or mini  # a Workload built by hand may not record the batch
    try:
        return micro_batch_rows(micro_batch, batch, batch // mini) == micro_batch
    except ConfigError:
        return False


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


def _check_flags(args: argparse.Namespace) -> None:
    """The device counts and size in range, by the flag's name."""
    for flag, value in (("--devices", args.devices), ("--devices-per-host", args.devices_per_host)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} = {value}: expected an integer >= 1")
    if args.device_memory_gb is not None and not args.device_memory_gb > 0:
        raise ConfigError(f"--device-memory-gb = {args.device_memory_gb}: expected a size > 0")


def main(args: argparse.Namespace) -> int:
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.learner.rl_config import RLConfig
    from jaxrl_llm.sharding.mesh import resolve_mesh_shape, run_device_count

    _check_flags(args)
    parse_gin(args.gin_file or ["grpo_tiny.gin"], args.gin_param)
    rl = RLConfig()
    rl.validate()  # what `train` refuses, `plan` refuses
    p = rl.policy
    checkpoint = args.model or p.checkpoint
    numerics = dict(dtype=p.dtype, param_dtype=p.param_dtype, remat=p.remat)
    cfg = model_config(checkpoint, **numerics)
    m = rl.mesh
    devices = run_device_count(m.devices, args.devices, where="the plan (--devices)")
    if m.rollout_devices >= devices:
        raise ConfigError(
            f"MeshConfig.rollout_devices = {m.rollout_devices} leaves none of the "
            f"{devices} devices to the trainer"
        )
    per_host = args.devices_per_host
    found = m.one_process_setting()
    if found is not None and per_host and per_host < args.devices:
        name, value, multi_host = found
        raise ConfigError(
            f"MeshConfig.{name} = {value} runs on one process only so far "
            f"(--devices-per-host={per_host} of {args.devices} is several); use {multi_host} "
            "for multi-host runs"
        )
    # The trainer's mesh takes the devices the sampler's do not (`learner.run._meshes`).
    trainer = devices - m.rollout_devices
    mesh_shape = resolve_mesh_shape(m.data, m.fsdp, m.tensor, num_devices=trainer)
    w = Workload.from_rl_config(rl)
    gb = args.device_memory_gb
    memory = gb * GB if gb is not None else _local_device_memory()
    kw = dict(name=checkpoint, devices_per_host=per_host)
    plan = plan_memory(cfg, mesh_shape, w, device_memory=memory, **kw)
    if plan.fits is False:
        plan.suggestions = suggest(cfg, mesh_shape, w, plan, **kw)
    if not args.json:
        print(plan.table())
    print(json.dumps(plan.to_json()))
    return 0 if plan.fits is not False else 1

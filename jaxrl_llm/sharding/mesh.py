"""Mesh construction from config and the multi-host initialisation hook."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.sharding.axes import MESH_AXES

log = logging.getLogger(__name__)


def resolve_mesh_shape(
    data: int = 1,
    fsdp: int = -1,
    tensor: int = 1,
    *,
    num_devices: int | None = None,
    source: str = "MeshConfig",
) -> tuple[int, int, int]:
    """Sizes for ("data", "fsdp", "tensor"); at most one may be -1 and fills the rest.

    A shape that cannot be made from the devices is a `ConfigError` naming `source`, the
    setting the sizes came from (`MeshConfig`, a command's `--mesh`), and what would fit.
    """
    n = jax.device_count() if num_devices is None else num_devices
    sizes = [data, fsdp, tensor]
    given = f"{source} " + ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, sizes))
    fix = f"sizes whose product is {n}, or -1 on one axis for the rest"
    if sum(s == -1 for s in sizes) > 1:
        raise ConfigError(f"{given}: at most one mesh axis may be -1")
    if any(s == 0 or s < -1 for s in sizes):
        raise ConfigError(f"{given}: mesh sizes must be positive or -1; use {fix}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if n % known:
            raise ConfigError(f"{given}: {n} devices cannot be split into it; use {fix}")
        sizes[sizes.index(-1)] = n // known
    if int(np.prod(sizes)) != n:
        raise ConfigError(
            f"{given}: the mesh needs {int(np.prod(sizes))} devices, but {n} are available; "
            f"use {fix}"
        )
    return tuple(sizes)  # type: ignore[return-value]


def sampler_mesh_shape(rollout_devices: int, tensor: int) -> tuple[int, int, int]:
    """The ("data", "fsdp", "tensor") shape of the devices set apart for the sampler
    (`MeshConfig.rollout_devices`): the trainer's `tensor` setting when it divides them
    (else 1), the rest on "data"."""
    t = tensor if tensor > 0 and rollout_devices % tensor == 0 else 1
    return rollout_devices // t, 1, t


def run_device_count(count: int, available: int, where: str = "this process") -> int:
    """How many devices a run uses (`MeshConfig.devices`) of `available`: `count`, or all of
    them for -1. Too many, or 0, is a `ConfigError` naming `where` the devices are counted."""
    if count == -1:
        return available
    if not 1 <= count <= available:
        raise ConfigError(
            f"MeshConfig.devices = {count}: {where} has {available} devices; use 1 to "
            f"{available}, or -1 for all"
        )
    return count


def run_devices(count: int = -1, devices=None) -> list:
    """The devices a run uses: the first `run_device_count` of `devices` (all of
    `jax.devices()` by default)."""
    devices = list(jax.devices() if devices is None else devices)
    return devices[: run_device_count(count, len(devices))]


def build_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, *, devices=None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh over all (or the given) devices."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, num_devices=len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Call `jax.distributed.initialize` when a multi-process run is configured.

    Arguments win over the environment (`JAXRL_COORDINATOR_ADDRESS`,
    `JAXRL_NUM_PROCESSES`, `JAXRL_PROCESS_ID`). On TPU VMs (and SLURM / Open MPI) JAX
    detects everything itself: set `JAXRL_DISTRIBUTED=auto`. With `JAX_PLATFORMS=cpu`
    (multi-process CPU runs and tests) collectives go through gloo. Returns whether it
    initialised.

    SIGTERM: `jax.distributed.initialize` installs JAX's preemption notifier, a C++ SIGTERM
    handler, over whatever the process had; a Python handler set before (the command line's,
    `cli._exit_cleanly_on_sigterm`: SIGTERM -> exit 143) is set again after it, else a
    distributed run would swallow SIGTERM and train on. JAX's preemption sync
    (`multihost_utils.reached_preemption_sync_point`) then never fires; nothing here uses it.
    """
    env = os.environ
    coordinator_address = coordinator_address or env.get("JAXRL_COORDINATOR_ADDRESS")
    if num_processes is None and env.get("JAXRL_NUM_PROCESSES"):
        num_processes = int(env["JAXRL_NUM_PROCESSES"])
    if process_id is None and env.get("JAXRL_PROCESS_ID"):
        process_id = int(env["JAXRL_PROCESS_ID"])
    if coordinator_address is None and env.get("JAXRL_DISTRIBUTED") != "auto":
        return False
    if env.get("JAX_PLATFORMS", "").split(",")[0] == "cpu":
        # Cross-process collectives on CPU need an implementation; gloo ships with jaxlib.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    log.info(
        "jax.distributed.initialize(coordinator=%s, num_processes=%s, process_id=%s)",
        coordinator_address,
        num_processes,
        process_id,
    )
    kept = _python_sigterm_handler()
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )
    if kept is not None:  # JAX's notifier replaced it below Python, which still reports it
        signal.signal(signal.SIGTERM, kept)
    return True


def _python_sigterm_handler() -> Callable[[int, FrameType | None], Any] | int | None:
    """The SIGTERM handler set from Python (a function, or SIG_IGN), to set again once JAX
    has installed its own; None for the default, or off the main thread (not ours to set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGTERM)
    return None if handler in (signal.SIG_DFL, None) else handler

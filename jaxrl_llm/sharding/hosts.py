"""What a multi-controller (multi-host) RL loop needs beyond one process.

JAX runs one Python process per host; every process runs the same program, and a jitted
computation over a global mesh is a collective all of them must enter in the same order.
Rollout is the part that cannot work that way: how many decode calls, tool turns and refills
a batch of samples takes depends on what was sampled, so each host must drive its own
engine over its own devices without waiting on the others. The pieces:

- `local_sampling_mesh(mesh)`: this host's devices, laid out for sampling. Tensor groups of
  the training mesh stay together; a tensor axis that spans hosts is refused.
- `WeightSync`: the trainer's params (global arrays, FSDP over every host) -> one full
  copy per host in the sampling layout, as arrays of that host's local mesh. One jitted
  collective (cast + all-gather into a "host-replicated" global layout), then each host
  wraps the shards it already holds as local arrays: no further copy.
- `allgather_objects`: small host-side results (completions, scores) from every host, so
  each host continues with the same global batch and takes the same decisions. Untagged it
  is a device collective, so every process must call it in the same order from one thread;
  tagged, it goes through the coordination service (`jax.distributed`'s key-value store)
  and may be called from any thread: the overlapped producer's gathers
  (`learner/overlap.py`) run beside the trainer's collectives that way. Every payload
  then passes through process 0's service to every host (traffic that grows with hosts
  squared), so the device collective stays the default.
- `global_array` / `put_batch` / `to_host`: numpy that every host holds -> a global array
  in a given sharding; a global array -> full numpy on every host.

Threads: a cross-host device collective must be entered by every process in the same order,
so two threads that each dispatch them interleave differently per host and deadlock (host A
runs the update's all-reduce, host B the gather, each waiting for the other). An overlapped
multi-host run therefore keeps every cross-host collective on the trainer's thread (the
weight gather: `WeightSync.stage`) and its producer thread exchanges host data by tag only.

With one process every function reduces to the single-host behaviour (no collectives).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.sharding.axes import MESH_AXES
from jaxrl_llm.sharding.reshard import already_placed, target_shardings
from jaxrl_llm.sharding.rules import SAMPLE_RULES, Rules
from jaxrl_llm.sharding.transfer import check_path, put_apart


def _host_devices(mesh: Mesh, process: int) -> list:
    """`process`'s devices of `mesh`, in the mesh's own (row-major) order."""
    return [d for d in mesh.devices.flat if d.process_index == process]


def check_tensor_in_host(tensor: int, devices_per_host: int) -> None:
    """A `ConfigError` unless `tensor` divides a host's devices: a multi-host RL run samples
    on each host's own devices (`local_sampling_mesh`), so a tensor group cannot span hosts
    (`train`'s mesh check, `plan`'s and the sampling mesh's own, one rule)."""
    if devices_per_host < 1 or devices_per_host % tensor:
        raise ConfigError(
            f"MeshConfig.tensor = {tensor} does not fit in a host's {devices_per_host} "
            "devices; a multi-host RL run samples on each host separately, so keep the tensor "
            "axis within a host (a divisor of its devices) and scale with fsdp/data"
        )


def _host_grid(mesh: Mesh, process: int) -> np.ndarray:
    tensor = mesh.shape["tensor"]
    devices = _host_devices(mesh, process)
    check_tensor_in_host(tensor, len(devices))
    # Consecutive devices along the (last, fastest) tensor axis form one tensor group.
    grid = np.empty((len(devices) // tensor, 1, tensor), dtype=object)
    for i, d in enumerate(devices):
        grid.flat[i] = d
    where = {d: idx[:-1] for idx, d in np.ndenumerate(mesh.devices)}  # all but tensor
    for group in grid.reshape(-1, tensor):
        if len({where[d] for d in group}) != 1:
            raise ConfigError(
                "a tensor group of the training mesh spans hosts; keep the tensor axis "
                "within a host for multi-host RL"
            )
    return grid


def local_sampling_mesh(mesh: Mesh) -> Mesh:
    """The mesh this host's rollout engine runs on: `mesh` itself with one process;
    otherwise ("data"=local devices / tensor, "fsdp"=1, "tensor") over this host's devices."""
    if jax.process_count() == 1:
        return mesh
    return Mesh(_host_grid(mesh, jax.process_index()), MESH_AXES)


def host_replicated_mesh(mesh: Mesh) -> Mesh:
    """All hosts' sampling meshes stacked along "data": a global mesh whose per-host slice is
    exactly that host's `local_sampling_mesh`. Params sharded on it by `SAMPLE_RULES` (never
    split over data/fsdp) hold one full copy per host."""
    grids = [_host_grid(mesh, p) for p in range(jax.process_count())]
    return Mesh(np.concatenate(grids, axis=0), MESH_AXES)


class WeightSync:
    """`sync(params) -> params for this host's engine`, laid out as `local_shardings`.

    `params`: the trainer's params (an nnx State of global arrays). `cast`: an optional
    jittable map applied on the way (e.g. to bfloat16). One process: the trainer's own
    arrays when they are already in the sampling layout (no copy), else one jitted
    cast/reshard; on devices apart from the trainer's (`MeshConfig.rollout_devices`), the
    cast where the params are, then a transfer (`transfer.put_apart`, by `transfer`: one of
    `transfer.PATHS`). Several processes: one jitted collective into the host-replicated
    layout, then each host wraps the shards it holds as arrays of its local mesh.
    """

    def __init__(
        self,
        abstract: Any,
        train_mesh: Mesh | None,
        local_shardings: Any,
        *,
        cast: Callable[[Any], Any] | None = None,
        rules: Rules = SAMPLE_RULES,
        transfer: str = "auto",
    ):
        check_path(transfer)  # when the sync is built, not at its first move
        self._multi = jax.process_count() > 1
        self._transfer = transfer
        self._local = jax.tree.leaves(local_shardings)
        treedef = jax.tree.structure(abstract)
        target = local_shardings
        if self._multi:
            if train_mesh is None:
                raise ValueError("a WeightSync on several processes needs the training mesh")
            target = target_shardings(abstract, host_replicated_mesh(train_mesh), rules)
        out = jax.tree.unflatten(treedef, jax.tree.leaves(target))
        self._cast = cast
        # Other devices than the trainer's (`MeshConfig.rollout_devices`): a jitted program
        # cannot span both, so the cast runs where the params are and a transfer moves them.
        # (No training mesh: a sampler built on its own, e.g. in tests, places nothing apart.)
        train = set(train_mesh.devices.flat) if train_mesh is not None else None
        self._apart = (
            not self._multi
            and train is not None
            and any(not s.device_set <= train for s in self._local)
        )
        self._out = out
        if self._apart:
            self._move = jax.jit(cast) if cast is not None else (lambda p: p)
        else:
            self._move = jax.jit(cast if cast is not None else (lambda p: p), out_shardings=out)

    def __call__(self, params: Any) -> Any:
        return self.local(self.stage(params))

    def stage(self, params: Any) -> Any:
        """The part of the sync that may run device collectives across hosts (several
        processes: the jitted cast and gather into the host-replicated layout, always new
        buffers); `local` finishes it with none. One process: the whole sync."""
        if self._apart:
            return put_apart(self._move(params), self._out, self._transfer)
        if not self._multi and self._cast is None and already_placed(params, self._local):
            return params
        return self._move(params)

    def local(self, glob: Any) -> Any:
        """`stage`'s result as arrays of this host's sampling mesh (several processes: the
        shards this host already holds, wrapped; no program runs)."""
        if not self._multi:
            return glob
        leaves, treedef = jax.tree.flatten(glob)
        local = [
            jax.make_array_from_single_device_arrays(
                x.shape, s, [shard.data for shard in x.addressable_shards]
            )
            for x, s in zip(leaves, self._local, strict=True)
        ]
        return jax.tree.unflatten(treedef, local)


def allgather_objects(obj: Any, tag: str | None = None) -> list[Any]:
    """[obj of process 0, obj of process 1, ...] on every process (pickled host data; keep
    it to what a step produces: token ids, logprobs, scores). One process: `[obj]`.
    `tag`: through the coordination service, from any thread (`exchange_objects`); None: a
    device collective, entered by every process in the same order (the module docstring)."""
    if jax.process_count() == 1:
        return [obj]
    if tag is not None:
        return exchange_objects(obj, tag)
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([payload.size], np.int64)))
    sizes = sizes.reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[: payload.size] = payload
    everyone = np.asarray(multihost_utils.process_allgather(buf))
    return [pickle.loads(everyone[p, : sizes[p]].tobytes()) for p in range(len(sizes))]


# Values of the coordination service are gRPC messages: a payload goes in parts this size.
_PART_BYTES = 1 << 20
# How long a process waits for another's part of an exchange: the hosts of a step finish
# sampling at different times (their samples differ), so this bounds a host's lag, not a
# step's length. A host that died fails the run sooner (the service reports it).
EXCHANGE_TIMEOUT_S = 3600


def exchange_objects(obj: Any, tag: str) -> list[Any]:
    """`allgather_objects` through `jax.distributed`'s key-value store: no device program,
    so any thread may call it while another runs cross-host collectives. `tag` names this
    exchange and must be the same on every process and never reused in the process's
    lifetime (e.g. a run, a step and a try); each process's parts are deleted once every
    process has read them (a barrier), so the service holds no step's data after it."""
    from jax._src import distributed  # the client Orbax's multihost helpers use too

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("exchange_objects needs jax.distributed.initialize() first")
    me, n = jax.process_index(), jax.process_count()
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    parts = [data[i : i + _PART_BYTES] for i in range(0, len(data), _PART_BYTES)] or [b""]
    key = f"jaxrl_llm/exchange/{tag}"
    for i, part in enumerate(parts):
        client.key_value_set_bytes(f"{key}/{me}/{i}", part)
    client.key_value_set(f"{key}/{me}/parts", str(len(parts)))  # last: the parts are there
    deadline = time.monotonic() + EXCHANGE_TIMEOUT_S
    ms = lambda: max(int((deadline - time.monotonic()) * 1000), 1)
    everyone = []
    for p in range(n):
        if p == me:
            everyone.append(pickle.loads(data))  # a copy, as the other processes get
            continue
        count = int(client.blocking_key_value_get(f"{key}/{p}/parts", ms()))
        got = [client.blocking_key_value_get_bytes(f"{key}/{p}/{i}", ms()) for i in range(count)]
        everyone.append(pickle.loads(b"".join(got)))
    client.wait_at_barrier(f"{key}/read", ms())
    for i in range(len(parts)):
        client.key_value_delete(f"{key}/{me}/{i}")
    client.key_value_delete(f"{key}/{me}/parts")
    return everyone


def batch_sharding(mesh: Mesh, shape: tuple[int, ...], axis: int = 0) -> NamedSharding:
    """Rows (dimension `axis`) split over ("data", "fsdp") when they divide, else replicated."""
    spec: list[Any] = [None] * len(shape)
    if shape[axis] % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0:
        spec[axis] = ("data", "fsdp")
    return NamedSharding(mesh, PartitionSpec(*spec))


def global_array(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from numpy every process holds in full (each takes its own shards)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def put_batch(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A batch array for a jitted step, in `sharding`: each device gets its own rows
    (`global_array`), with one process as with several. (One process once made a plain
    array on the first device, which then held the whole batch through every update:
    per-shard copies between multi-device programs had preceded rare XLA:CPU collective
    deadlocks in tests, whose cause, a too-small CPU client thread pool, `cpu_devices`
    fixes: docs/testing.md.)"""
    return global_array(x, sharding)


def to_host(x: Any) -> np.ndarray:
    """Full numpy of a (possibly multi-host) array, on every process."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)

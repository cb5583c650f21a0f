"""Arrays put on devices apart from their own: the trainer's params onto the sampler's
devices (`MeshConfig.rollout_devices`, `hosts.WeightSync`).

`jax.device_put` onto another device set copies device to device only where some source
shard already holds the slice a destination device needs. An FSDP-sharded trainer array
going to a replicated sampler has no such shard, so JAX assembles the whole array on the
host (`Array._value`, a plain `numpy` array it also keeps cached on the trainer's array)
and puts it from there, once per destination device. On CPU devices, where every device
is the one host memory, that is the whole move, and two details of it set its cost:

- XLA:CPU wraps a host buffer whose address is a multiple of 64 bytes without copying it
  (every destination device then reads the same memory), and copies any other. glibc's
  `malloc` returns large blocks 16 bytes past a page boundary, so `numpy`'s copy is never
  wrapped: each of the sampler's devices gets a copy of its own (four copies of the model
  for four devices), and the trainer's array keeps a fifth (the cache).
- The assembly is one thread's copy.

`put_apart` therefore assembles each array itself on CPU devices: into a 64-byte-aligned
buffer, the large ones a shard per thread, and puts that; the sampler's devices share it,
and nothing is cached on the trainer's arrays. The move writes each byte of the model
once. Measured in docs/performance.md (`jaxrl-llm bench weight-sync`); reusing the host
buffers of an earlier move once no array held them was measured there too and not kept.

On accelerators a destination device needs a buffer in its own memory, and
`jax.device_put` of an FSDP-sharded source takes the same trip through the host (device to
host, assembled on one thread, host to each device). So `copy_between_devices` has each
sampler device pull what it needs straight from the trainer's devices: from every source
shard the part that overlaps its own slice (cut on the source device when the shard holds
more, a replicated shard read from a different replica by each destination), copied device
to device, then put together where it landed by a small jitted program. Each destination
receives its bytes once, from all the sources at once, and the trainer's devices hold
nothing extra but the cut parts of their shards, for a target that splits them. The
pieces of one array live on a destination until they are put together; the copies are
waited for every `PENDING_BYTES` queued, so the pieces in flight stay about that size.
`put_apart` takes this path for any device that is not a CPU; `path` picks either on any
platform (the benchmark's `--transfer`). On CPU devices it is correct but holds a copy per
device where the host path shares one; no accelerator was at hand to time it.

Sharing is safe because a jax.Array is immutable: the shared buffer is only ever read, and
it lives as long as any array on it (each device buffer made from it holds a reference to
it; one copied from it, until its copy is done).
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ALIGN = 64  # XLA:CPU takes a host buffer aligned to this many bytes without a copy
# Arrays at least this large are assembled a shard per thread (numpy's copy releases the
# GIL); below it the threads' overhead outweighs the copy.
PARALLEL_BYTES = 4 << 20
# The device path waits for its copies whenever this many bytes have been queued since the
# last wait: the pieces in flight on a destination device are at most about that much.
PENDING_BYTES = 1 << 30
PATHS = ("auto", "host", "devices")


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array whose data starts at a multiple of `ALIGN` bytes."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@functools.cache
def _pool() -> cf.ThreadPoolExecutor:
    return cf.ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="put-apart")


def _index_key(index: tuple[slice, ...]) -> tuple:
    return tuple((s.start, s.stop, s.step) for s in index)


def assemble(x: jax.Array) -> np.ndarray:
    """`x` (fully addressable) as one aligned host array: each distinct shard copied once (a
    replicated shard is read from one device), large arrays a shard per thread."""
    out = aligned_empty(x.shape, x.dtype)
    shards = {_index_key(s.index): s for s in x.addressable_shards}.values()
    copy = lambda s: out.__setitem__(s.index, np.asarray(s.data))
    if x.nbytes < PARALLEL_BYTES or len(shards) == 1:
        for s in shards:
            copy(s)
    else:
        for f in [_pool().submit(copy, s) for s in shards]:
            f.result()
    return out


def _on_cpu(leaves: list[Any], shardings: list[Any]) -> bool:
    devices = {d for s in shardings for d in s.device_set}
    devices |= {d for x in leaves for d in x.sharding.device_set}
    return all(d.platform == "cpu" for d in devices)


def check_path(path: str) -> None:
    """A `ValueError` naming the choices unless `path` is one of `PATHS`."""
    if path not in PATHS:
        raise ValueError(f"transfer path {path!r}: use one of {PATHS}")


def put_apart(tree: Any, shardings: Any, path: str = "auto") -> Any:
    """`tree` (jax arrays of one process) laid out as `shardings` on other devices: through
    one aligned host copy ("host", what "auto" takes when every device is a CPU) or device
    to device ("devices", `copy_between_devices`; "auto" anywhere else)."""
    check_path(path)
    leaves, treedef = jax.tree.flatten(tree)
    targets = jax.tree.leaves(shardings)
    if path == "devices" or (path == "auto" and not _on_cpu(leaves, targets)):
        return copy_between_devices(tree, shardings)
    host = [assemble(x) for x in leaves]
    return jax.device_put(jax.tree.unflatten(treedef, host), shardings)


def copy_between_devices(tree: Any, shardings: Any) -> Any:
    """`tree` laid out as `shardings`, each destination device pulling its part from the
    source shards that hold it, device to device, and assembling it where it lands (module
    docstring); waits every `PENDING_BYTES`."""
    leaves, treedef = jax.tree.flatten(tree)
    targets = jax.tree.leaves(shardings)
    out, pending, queued = [], [], 0
    for x, target in zip(leaves, targets, strict=True):
        out.append(_pulled(x, target))
        pending.append(out[-1])
        queued += x.nbytes
        if queued >= PENDING_BYTES:
            jax.block_until_ready(pending)  # their pieces are freed once assembled
            pending, queued = [], 0
    return jax.tree.unflatten(treedef, out)


Box = tuple[tuple[int, int], ...]  # [start, stop) on each axis


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple(i.indices(n)[:2] for i, n in zip(index, shape, strict=True))


def _pulled(x: jax.Array, target: Any) -> jax.Array:
    """`x` as `target` lays it out: each destination device copies the overlap of its box
    with each distinct source shard's (the j-th destination from the j-th replica of a
    replicated shard), and a jitted program there puts the pieces together."""
    replicas: dict[Box, list[jax.Array]] = {}
    for shard in x.addressable_shards:
        replicas.setdefault(_box(shard.index, x.shape), []).append(shard.data)
    pieces = []
    for j, (device, index) in enumerate(target.addressable_devices_indices_map(x.shape).items()):
        box = _box(index, x.shape)
        parts, offsets = [], []
        for source_box, datas in replicas.items():
            overlap = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, source_box))
            if any(lo >= hi for lo, hi in overlap):
                continue
            data = datas[j % len(datas)]
            if overlap != source_box:  # cut where it is, before it crosses
                data = data[_relative(overlap, source_box)]
            parts.append(jax.device_put(data, device))
            offsets.append(tuple(r.start for r in _relative(overlap, box)))
        shape = tuple(b - a for a, b in box)
        whole = len(parts) == 1 and parts[0].shape == shape
        pieces.append(parts[0] if whole else _put_together(shape, x.dtype, tuple(offsets))(*parts))
    return jax.make_array_from_single_device_arrays(x.shape, target, pieces)


def _relative(inner: Box, outer: Box) -> tuple[slice, ...]:
    """`inner` as slices of an array that holds `outer`."""
    return tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(inner, outer, strict=True))


@functools.cache
def _put_together(shape: tuple[int, ...], dtype: Any, offsets: tuple[tuple[int, ...], ...]):
    """A jitted program that writes its pieces at `offsets` into one array of `shape` (run on
    the device the pieces are on)."""

    def together(*parts):
        out = jnp.zeros(shape, dtype)
        for part, at in zip(parts, offsets, strict=True):
            out = jax.lax.dynamic_update_slice(out, part, at)
        return out

    return jax.jit(together)

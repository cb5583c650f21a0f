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
`jax.device_put` moves the arrays as before; for an FSDP-sharded source that is the same
trip through the host. Gathering on the trainer's devices first, so that JAX copies device
to device, is the path to build there; it is not built, since no accelerator was at hand
to measure it.

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
import numpy as np

ALIGN = 64  # XLA:CPU takes a host buffer aligned to this many bytes without a copy
# Arrays at least this large are assembled a shard per thread (numpy's copy releases the
# GIL); below it the threads' overhead outweighs the copy.
PARALLEL_BYTES = 4 << 20


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


def put_apart(tree: Any, shardings: Any) -> Any:
    """`tree` (jax arrays of one process) laid out as `shardings` on other devices."""
    leaves, treedef = jax.tree.flatten(tree)
    targets = jax.tree.leaves(shardings)
    if not _on_cpu(leaves, targets):
        return jax.device_put(tree, shardings)
    host = [assemble(x) for x in leaves]
    return jax.device_put(jax.tree.unflatten(treedef, host), shardings)

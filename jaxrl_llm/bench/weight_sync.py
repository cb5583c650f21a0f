"""`jaxrl-llm bench weight-sync`: the trainer's weights moved to a sampler on devices of its
own (`MeshConfig.rollout_devices`), against the machine's read bandwidth measured in the same
run (issue #29's target: the move at half of it or better).

What runs: the policy (`--checkpoint`: 'builtin', an HF folder, or a `models.presets` shape
with random weights) is loaded on the trainer's mesh (every device but the last
`--rollout-devices`, FSDP over them), and the RL loop's own push to a sampler apart
(`hosts.WeightSync` into the sampling layout on the last devices, no cast: one transfer of
every array) is timed `--repeats` times after a warm-up; median and best. Each move is of
arrays the trainer's devices have just written (a jitted copy, untimed), as after an update:
moving the same arrays again would time what an earlier move left cached (JAX keeps the
host copy it assembles on the source array). The sampling layout holds the whole model on
every sampler device (tensor = 1 here): `bytes_delivered` = `bytes` x the sampler's
devices. `bytes_written` counts the distinct buffers the sampler's arrays hold: on CPU
devices they share one host copy (`sharding/transfer.py`), so it is `bytes`; on
accelerators each device holds its own. Rates count `bytes_written`. `--transfer` picks the
move's path (`transfer.put_apart`): `host` (one host copy), `devices` (each sampler device
pulls its part from the trainer's shards, device to device) or `auto` (host on CPU devices,
device to device elsewhere), so an accelerator host can time both.

The bandwidth it is held against is measured beside it: each timed move is followed by a
streaming read (`machine.read_probe`: a sum over 256 MB, which reads each byte once), and
each pair gives one ratio, so a host whose speed drifts between seconds (on the AVX-512 EPYC
host the read rate swung from 18 to 44 GB/s within one run) moves both sides of it:

    fraction_of_read_bandwidth  median over the pairs of move_bytes_per_s / read rate: bytes
                                written per second, the issue's measure
    traffic_fraction            the same with the least memory traffic a move makes: every
                                byte written, and each of the trainer's bytes read at least
                                once (bytes_written + bytes); on simulated CPU devices one
                                memory serves both sides, as two chips' memories would

Also in the run: the usual `ceilings` (best of 5 reads; `fraction_vs_best_read` is the
median move rate over that read rate, this benchmark's measure before the pairs) and a
jitted copy of the same params on the trainer's own devices (each byte read and written
once, no device crossed). On simulated CPU devices (`--xla_force_host_platform_device_count`)
a move is a copy in the one host's memory; between accelerator chips it would cross their
links.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from jaxrl_llm.bench.machine import bench_checkpoint, machine_ceilings, read_probe, waited_call


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rollout-devices",
        type=int,
        default=0,
        help="weight-sync: the devices set apart for the sampler (default: half of them)",
    )
    parser.add_argument(
        "--transfer",
        choices=("auto", "host", "devices"),  # transfer.PATHS (parsing imports no JAX)
        default="auto",
        help="weight-sync: the move's path (`sharding/transfer.put_apart`): through one host "
        "copy, device to device, or auto (host on CPU devices, device to device elsewhere)",
    )


def _timed(fn, repeats: int) -> list[float]:
    """Seconds of `repeats` calls of `fn` (each waited for), after one warm-up call."""
    waited_call(fn)
    return [waited_call(fn)[1] for _ in range(repeats)]


def _paired(fresh, move, read, repeats: int) -> tuple[list[float], list[float]]:
    """(move seconds, read seconds) of `repeats` rounds of one `move(fresh())` then one
    `read()`, after a warm-up move; `fresh()` (untimed) gives new arrays to move. Each move's
    arrays live until the next move is done, as the sampler keeps its copy until a sync
    replaces it."""
    previous = waited_call(lambda: move(waited_call(fresh)[0]))[0]
    moves, reads = [], []
    for _ in range(repeats):
        source = waited_call(fresh)[0]
        moved, move_s = waited_call(functools.partial(move, source))
        del previous, source  # the sampler lets its old copy go once the new one is in
        moves.append(move_s)
        reads.append(waited_call(read)[1])
        previous = moved  # noqa: F841 (held, not read: the next round lets it go)
    return moves, reads


def _distinct_bytes(tree: Any) -> int:
    """Bytes of the distinct device buffers under `tree`'s arrays (shared ones once)."""
    import jax

    buffers = {
        (s.data.unsafe_buffer_pointer(), s.data.nbytes)
        for x in jax.tree.leaves(tree)
        for s in x.addressable_shards
    }
    return sum(n for _, n in buffers)


def free_bytes() -> int:
    """The host memory free now (not counting what the kernel could reclaim)."""
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_room(nbytes: int, sampler_devices: int) -> None:
    """Refuses `--transfer devices` on CPU devices when the host's free memory cannot hold
    what it needs: each simulated sampler device holds its own copy (the host path shares
    one), twice while the previous move is kept, beside the trainer's params and a fresh
    copy of them."""
    need = nbytes * (2 * sampler_devices + 2)
    free = free_bytes()
    if need > free:
        raise SystemExit(
            f"bench weight-sync: --transfer devices on CPU devices needs about {need / 1e9:.1f} "
            f"GB ({sampler_devices} sampler copies of {nbytes / 1e9:.2f} GB, twice, and the "
            f"trainer's two), and {free / 1e9:.1f} GB is free: use --transfer host, fewer "
            "--rollout-devices or a smaller --checkpoint"
        )


def measure(path: Path, rollout_devices: int, repeats: int, transfer: str) -> dict[str, Any]:
    """The move of the policy at `path` from the trainer's devices to the sampler's."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.sharding import SAMPLE_RULES, build_mesh, hosts, target_shardings
    from jaxrl_llm.sharding.mesh import sampler_mesh_shape

    devices, r = jax.devices(), rollout_devices or jax.device_count() // 2
    if not 0 < r < len(devices):
        raise SystemExit(
            f"bench weight-sync: --rollout-devices {r} must leave the trainer at least one of "
            f"the {len(devices)} devices (on CPU, simulate more: "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8)"
        )
    train = build_mesh(fsdp=-1, devices=devices[:-r])
    sampler = build_mesh(*sampler_mesh_shape(r, 1), devices=devices[-r:])
    params = nnx.state(from_pretrained(path, mesh=train))
    nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
    if transfer == "devices" and devices[0].platform == "cpu":
        _check_room(nbytes, r)
    out = target_shardings(params, sampler, SAMPLE_RULES)
    sync = hosts.WeightSync(params, train, out, transfer=transfer)
    moved = sync(params)
    on_sampler = all(x.sharding.device_set <= set(devices[-r:]) for x in jax.tree.leaves(moved))
    pairs = zip(jax.tree.leaves(params), jax.tree.leaves(moved), strict=True)
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
    # The sampling layout replicates over the sampler's "data" axis: one copy per data group.
    delivered = sum(s.data.nbytes for x in jax.tree.leaves(moved) for s in x.addressable_shards)
    written = _distinct_bytes(moved)
    del moved
    copy = jax.jit(lambda p: jax.tree.map(jnp.copy, p))
    read, read_bytes = read_probe()
    move_s, read_s = _paired(lambda: copy(params), sync, read, repeats)
    copy_s = _timed(lambda: copy(params), repeats)
    reads = [read_bytes / t for t in read_s]  # the read rate after each move
    fraction = statistics.median(written / t / r for t, r in zip(move_s, reads, strict=True))
    return {
        "transfer": transfer,
        "trainer_devices": len(devices) - r,
        "sampler_devices": r,
        "bytes": nbytes,
        "bytes_delivered": delivered,
        "bytes_written": written,
        "arrays": len(jax.tree.leaves(params)),
        "on_sampler_devices": on_sampler,
        "equal_to_the_trainers": same,
        "move_s": {"median": statistics.median(move_s), "best": min(move_s), "each": move_s},
        "local_copy_s": {"median": statistics.median(copy_s), "best": min(copy_s)},
        "read_bytes_per_s": {"median": statistics.median(reads), "each": reads},
        "fraction_of_read_bandwidth": fraction,
        "traffic_fraction": fraction * (written + nbytes) / written,
    }


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_checkpoint(args.checkpoint, Path(tmp))
        moved = measure(path, args.rollout_devices, args.repeats, args.transfer)
    ceilings = machine_ceilings()
    move_rate = moved["bytes_written"] / moved["move_s"]["median"]
    copy_rate = moved["bytes"] / moved["local_copy_s"]["median"]
    result = {
        "suite": "weight-sync",
        "checkpoint": args.checkpoint,
        **moved,
        "move_bytes_per_s": move_rate,
        "local_copy_bytes_per_s": copy_rate,
        "ceilings": ceilings,
        "fraction_vs_best_read": move_rate / ceilings["read_bytes_per_s"],
        "move_vs_local_copy": move_rate / copy_rate,
    }
    print(json.dumps(result, indent=1))
    return 0

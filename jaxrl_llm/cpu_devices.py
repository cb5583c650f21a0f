"""XLA:CPU's thread pool, sized so that collectives of simulated devices cannot deadlock.

With `--xla_force_host_platform_device_count=D` (the tests' 8-device mesh, a laptop trying
a sharded config) every jitted program with a collective needs all D device tasks running
at once. jaxlib 0.10.2's CPU client runs them on one pool of
`max(PJRT_NPROC or NPROC or cores, D)` threads, i.e. exactly D threads on a small machine.
The same pool also runs each device's launch of the next program, and a launch takes a slot
of the device's in-flight semaphore (32 programs) *on that pool thread*, blocking it while
the device is 32 programs behind the host. So once Python is 32 programs ahead, one
dispatch parks up to D pool threads in the semaphore while the oldest program's collective
waits for a free thread that never comes: "only 6 of 8 arrived" after XLA's rendezvous
timeout, or a 0%-CPU hang. Every Python thread that dispatches can park D threads, so the
pool needs D x (1 + dispatching threads). docs/testing.md has the measurements.

Import this module and call `size_thread_pool()` before JAX creates its CPU backend; it
imports nothing heavy.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

# Python threads that may dispatch programs at once: the caller plus JetStream's prefill
# and generate threads when a server runs in-process.
DISPATCH_THREADS = 3

_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def simulated_device_count(env: MutableMapping[str, str] = os.environ) -> int:
    """The device count forced through XLA_FLAGS (1 when none is)."""
    found = _COUNT.findall(env.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else 1


def pool_threads(devices: int, dispatch_threads: int = DISPATCH_THREADS) -> int:
    """Threads the CPU client needs: each dispatching thread can park one per device."""
    return devices * (1 + dispatch_threads)


def size_thread_pool(env: MutableMapping[str, str] = os.environ) -> int | None:
    """Raise PJRT_NPROC to `pool_threads` of the simulated device count (never lower it).

    PJRT_NPROC wins over NPROC in the CPU client, so an NPROC set for other reasons cannot
    shrink the pool below what collectives need. Returns the size set, or None when nothing
    changed (one device, or a PJRT_NPROC already large enough)."""
    devices = simulated_device_count(env)
    threads = pool_threads(devices)
    current = env.get("PJRT_NPROC", "")
    if devices <= 1 or (current.isdigit() and int(current) >= threads):
        return None
    env["PJRT_NPROC"] = str(threads)
    return threads

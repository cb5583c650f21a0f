"""Transparent huge pages for the host memory XLA:CPU allocates, asked of glibc's malloc.

XLA:CPU gives every program's outputs and temporaries fresh buffers from `malloc`. Those
above glibc's mmap threshold (32 MB at most) are new mappings, so a step's activations,
gradients and copies fault their pages in 4 KiB at a time, each zeroed by the kernel
first. Where the kernel's THP mode is `madvise` (`/sys/kernel/mm/transparent_hugepage/
enabled`; so on the hosts this project is tested on), pages become 2 MiB only when the
program asks, and glibc 2.35+ asks (`madvise(MADV_HUGEPAGE)` on what it maps) when the
tunable `glibc.malloc.hugetlb=1` is set. The 0.5B-shape policy step (`jaxrl-llm bench
train`, batch 2 x 256, 1 device) made 22.8 million page faults in one benchmark run
without it and 1.2 million with it (docs/performance.md has the times). The price is paid
once, where a process first touches its memory: on the AVX-512 EPYC host a fresh 2 MiB page
took about ten times as long per byte to zero as 4 KiB pages, and the tiny model's first RL
step ran 1.0-1.6 s longer, its later steps 6-16% shorter (2026-12-07).

glibc reads `GLIBC_TUNABLES` once, when the process starts, so the `jaxrl-llm` command
starts itself again with it set (`reexec_with_huge_pages`, the first thing it does before a
command runs) when all of these hold: Linux with glibc 2.35 or newer, THP mode `madvise`,
no `glibc.malloc.hugetlb` in `GLIBC_TUNABLES` already, `JAXRL_LLM_HUGE_PAGES` not `0` (the
opt-out), and this process not already restarted for it. In mode `always` every large
mapping already gets huge pages, and in `never` none can. Processes the run starts (reward
workers, the sandbox) inherit the setting. Imports nothing heavy.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "JAXRL_LLM_HUGE_PAGES"  # "0": leave malloc as it is
STARTED = "JAXRL_LLM_STARTED_FOR_HUGE_PAGES"  # set in the restarted process: never twice
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)  # the first glibc with glibc.malloc.hugetlb


def thp_mode(path: Path = THP_ENABLED) -> str | None:
    """The kernel's THP mode, the bracketed word of `always [madvise] never`; None when the
    file is missing or unreadable (not Linux, THP compiled out)."""
    try:
        found = re.search(r"\[(\w+)\]", path.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library when it is glibc, else None (musl, macOS)."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        return None
    parts = version.split(".")
    if name != "glibc" or len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def huge_page_env(
    env: Mapping[str, str],
    mode: str | None,
    glibc: tuple[int, int] | None,
    platform: str = sys.platform,
) -> dict[str, str] | None:
    """The environment to start again with (`env` with the tunable added to any
    `GLIBC_TUNABLES` already there), or None when a restart would change nothing."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if (
        not platform.startswith("linux")
        or glibc is None
        or glibc < MIN_GLIBC
        or mode != "madvise"
        or TUNABLE in tunables
        or env.get(OPT_OUT, "1") == "0"
        or STARTED in env
    ):
        return None
    tunables = ":".join(filter(None, [tunables, f"{TUNABLE}=1"]))
    return {**env, "GLIBC_TUNABLES": tunables, STARTED: "1"}


def in_effect(env: Mapping[str, str] = os.environ, mode: str | None = None) -> bool:
    """Whether this process's large mallocs get huge pages: THP mode `always`, or `madvise`
    with the tunable on (what a benchmark reports beside its host, `bench.machine.host`)."""
    mode = thp_mode() if mode is None else mode
    on = f"{TUNABLE}=1" in env.get("GLIBC_TUNABLES", "").split(":")
    return mode == "always" or (mode == "madvise" and on)


def reexec_with_huge_pages() -> None:
    """Replace this process by the same command line with the tunable set, when
    `huge_page_env` says it would change something; returns only when it would not (or the
    restart is impossible: no interpreter path, or exec refused, then nothing changes)."""
    env = huge_page_env(os.environ, thp_mode(), glibc_version())
    if env is None or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError:  # e.g. the interpreter moved: run on without huge pages
        return

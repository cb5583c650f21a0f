"""The decode program compiled on a thread while the first prefills and inserts compile.

A rollout's first device calls each compile a program, one after the other: the prompts'
prefill, the insert, then the decode steps (`Engine.generate_steps`), the largest. The
decode program's arguments are known before any prompt is (the params in the sampling
layout and the engine's decode state: shapes, dtypes and shardings fixed when the engine
is built), so `Engine.compile_steps_ahead`, called by the driver as a rollout starts, lowers
and compiles it on a thread of its own (`jit(...).lower(abstract arguments).compile()`,
which fills the cache the call reads) while the main thread traces, compiles and runs the
prefills and inserts; `generate_steps` joins the thread before its first call. Nothing here
decides a result: a compile that fails or misses the call's arguments leaves the call to
compile its own. On two cores XLA:CPU compiles on about 1.7 of them, so what this overlaps
is one program's tracing and lowering (Python, one core) with the other's compile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger(__name__)


class AheadCompiles:
    """Programs compiled on threads before their first call, each key once (an engine
    holds one)."""

    def __init__(self) -> None:
        self._started: set[Hashable] = set()
        self._threads: dict[Hashable, threading.Thread] = {}

    def start(self, key: Hashable, lower: Callable[[], Any]) -> None:
        """Call `lower()` on a thread and compile the `jax.stages.Lowered` it returns, unless
        `key` was started before."""
        if key in self._started:
            return
        self._started.add(key)
        thread = threading.Thread(target=_compile, args=(lower,), name="decode-ahead", daemon=True)
        self._threads[key] = thread
        thread.start()

    def wait(self, key: Hashable) -> None:
        """Returns when `key`'s compile is done (at once if none runs)."""
        thread = self._threads.pop(key, None)
        if thread is not None:
            thread.join()


def _compile(lower: Callable[[], Any]) -> None:
    try:
        lower().compile()
    except Exception:  # the call compiles its own program and raises its own error
        log.debug("compiling ahead failed; the first call compiles it", exc_info=True)

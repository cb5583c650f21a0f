"""XLA compile time as JAX reports it, for benchmarks that separate compiling from running."""

from __future__ import annotations

import time

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch


class CompileClock:
    """XLA compile seconds as JAX reports them (`jax.monitoring`), each with its end time."""

    def __init__(self):
        self.events: list[tuple[float, float]] = []  # (perf_counter at the end, seconds)

    def _listen(self, event: str, duration: float, **_) -> None:
        if event == COMPILE_EVENT:
            self.events.append((time.perf_counter(), duration))

    def __enter__(self) -> CompileClock:
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._listen)

    def between(self, t0: float, t1: float) -> float:
        return sum(d for t, d in self.events if t0 < t <= t1)

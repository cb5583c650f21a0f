"""XLA compile time as JAX reports it, for benchmarks that separate compiling from running."""

from __future__ import annotations

import contextlib
import time

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch


class CompileClock:
    """XLA compile seconds as JAX reports them (`jax.monitoring`), each with its end time."""

    def __init__(self):
        self.events: list[tuple[float, float]] = []  # (perf_counter at the end, seconds)

    def _listen(self, event: str, duration_secs: float, **_: str | int) -> None:
        if event == COMPILE_EVENT:
            self.events.append((time.perf_counter(), duration_secs))

    def __enter__(self) -> CompileClock:
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._listen)

    def between(self, t0: float, t1: float) -> float:
        return sum(d for t, d in self.events if t0 < t <= t1)


def _cache_flag(name: str):
    """A JAX compile-cache setting, read as JAX documents (an attribute of `jax.config`,
    which its type stub does not declare)."""
    import jax

    return getattr(jax.config, f"jax_{name}")


def compile_cache_in_use() -> bool:
    """Whether compiles now read from and write to JAX's persistent compilation cache."""
    return bool(_cache_flag("compilation_cache_dir") and _cache_flag("enable_compilation_cache"))


@contextlib.contextmanager
def persistent_cache_off():
    """JAX's persistent compilation cache off inside (nothing read from it or written to
    it), as it was after. Every `jaxrl-llm` command turns the cache on (`cli.compile_cache`),
    and a warm one reports a program's compile as its load from disk (0.7 s for a 10 s
    compile), so the benchmarks measure with it off: the compile times they report are
    XLA's, the same on every run. JAX decides once whether a process uses the cache;
    `reset_cache` makes it decide again."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    was = _cache_flag("enable_compilation_cache")
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        compilation_cache.reset_cache()

"""Many code runs at once without blocking the caller: `PythonExecutor` and `run_python_many`.

Each run is a separate sandboxed process, so threads only wait on pipes; `max_workers` is
the number of programs alive at once (CPU-bound model code: about the number of spare cores).
The rollout submits a run as soon as a sample stops at a tool call and collects the future
when it needs the observation, so decoding of other samples continues meanwhile.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence

from jaxrl_llm.tools.sandbox import run_python
from jaxrl_llm.tools.sandbox_types import ExecResult, SandboxConfig


def default_workers() -> int:
    return max(2, min(32, os.cpu_count() or 2))


class PythonExecutor:
    """A thread pool of sandbox runs.

    >>> with PythonExecutor(SandboxConfig(timeout_s=5)) as ex:
    ...     future = ex.submit("print(1 + 1)")
    ...     future.result().stdout
    '2\\n'
    """

    def __init__(self, config: SandboxConfig | None = None, *, max_workers: int | None = None):
        self.config = config or SandboxConfig()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers or default_workers(), thread_name_prefix="sandbox"
        )

    def submit(self, code: str) -> concurrent.futures.Future[ExecResult]:
        return self._pool.submit(run_python, code, config=self.config)

    def map(self, codes: Sequence[str]) -> list[ExecResult]:
        """Runs all `codes` concurrently; results in input order."""
        return [f.result() for f in [self.submit(code) for code in codes]]

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

    def __enter__(self) -> PythonExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def run_python_many(
    codes: Sequence[str],
    *,
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    config: SandboxConfig | None = None,
    max_workers: int | None = None,
) -> list[ExecResult]:
    """`run_python` over `codes` in parallel; results in input order."""
    config = config or SandboxConfig()
    overrides = {}
    if timeout_s is not None:
        overrides["timeout_s"] = timeout_s
    if memory_mb is not None:
        overrides["memory_mb"] = memory_mb
    config = SandboxConfig(**{**config.__dict__, **overrides})
    with PythonExecutor(config, max_workers=max_workers) as executor:
        return executor.map(codes)

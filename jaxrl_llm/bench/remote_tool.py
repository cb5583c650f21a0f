"""ToRL's Python tool behind a remote sandbox's round trip, for `bench rl-step`.

A tool that runs in another service (SandboxFusion over HTTP, a search API) answers each
call after a network and queueing delay that no local sandbox shows. `remote_python` is the
run's Python tool (`tools.python_tool.PythonTool`, the same sandbox and the same answers)
whose every answered call returns `latency_s` seconds later, so a benchmark can show what
overlapping rollout with training buys when tool latency dominates a step
(`configs/bench_torl_remote.gin`, docs/performance.md). The delay is the measurement's
input: this is a benchmark's stand-in for a remote service, not a tool to train with.

    jaxrl-llm bench rl-step --gin_file configs/bench_torl_remote.gin \\
        --gin_param RLConfig.max_staleness=1
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import gin

from jaxrl_llm.tools.python_tool import PythonTool


class RemoteLatency:
    """`tool` whose answered calls take `latency_s` longer (a None answer, no call, is as
    quick as the tool's)."""

    def __init__(self, tool: PythonTool, latency_s: float):
        if latency_s < 0:
            raise ValueError(f"remote_python.latency_s must be >= 0, got {latency_s}")
        self.tool, self.latency_s = tool, float(latency_s)
        self.name, self.stop_strings = tool.name, tool.stop_strings

    def __call__(self, text: str) -> str | None:
        answer = self.tool(text)
        if answer is not None:
            time.sleep(self.latency_s)  # the simulated round trip (see the module docstring)
        return answer

    def response_metrics(self, responses: Sequence[str]) -> dict[str, float]:
        return self.tool.response_metrics(responses)


@gin.configurable
def remote_python(latency_s: float = 0.5) -> RemoteLatency:
    """The `RolloutConfig.tool` factory: `PythonTool()` with `latency_s` per answered call."""
    return RemoteLatency(PythonTool(), latency_s)

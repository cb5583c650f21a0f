"""What the rollout driver calls between model turns: the `Tool` protocol.

One tool turn, as the rollout driver runs it:
  1. The model generates until one of `tool.stop_strings`; the stop string stays in the
     response (it is the model's own writing, so it is trained) and ends the text handed
     to the tool.
  2. `observation = tool(text_so_far)`; None means "no call here": the sample is finished.
  3. The observation is tokenised, appended, and masked out of the policy loss and the KL.
  4. Generation continues, for at most the configured number of tool calls.
`observe_many` runs `observe` for a batch of samples concurrently; tools whose work is I/O
or a subprocess (sandbox, retriever) overlap that way without blocking the caller's thread
for longer than the slowest call.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tool(Protocol):
    """A tool: the model's text so far in, the observation text to append out (or None)."""

    name: str
    stop_strings: tuple[str, ...]

    def __call__(self, text: str) -> str | None: ...

    def observe(self, text: str) -> str | None: ...


@runtime_checkable
class ReportsMetrics(Protocol):
    """Optional beside `Tool`: a tool that reads its own results back from the finished
    responses (the Python tool: the share of its runs that succeeded). The rollout stage
    logs whatever it returns with the step's `env/*` metrics, so what a tool measures is
    decided by the tool, not by its name."""

    def response_metrics(self, responses: Sequence[str]) -> dict[str, float]: ...


def observe_many(tool: Tool, texts: Sequence[str], *, max_workers: int = 16) -> list[str | None]:
    """`tool.observe` over `texts` concurrently; results in input order."""
    if len(texts) <= 1:
        return [tool.observe(t) for t in texts]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(max_workers, len(texts))) as pool:
        return list(pool.map(tool.observe, texts))

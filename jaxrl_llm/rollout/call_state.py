"""`CallState`: the host state of one `RolloutDriver.generate` call (`rollout.driver`).

Its prompts and their sampling, the decode slots and the samples in them, the prompts not
prefilled yet and those prefilled whose samples wait for a slot (`ready`), the tool calls
running, the finished samples, and the version of the weights in use (partial rollouts).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxrl_llm.rollout.completions import LiveSample
from jaxrl_llm.rollout.records import Prefix
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.tools.protocol import ToolCallback
from jaxrl_llm.types import Completion

# Partial rollouts: newer (params, version) to continue with, or None (`generate`'s `refresh`).
Refresh = Callable[[], tuple[Any, int] | None]


@dataclasses.dataclass
class CallState:
    """Host state of one `RolloutDriver.generate` call."""

    ids: list[np.ndarray]
    sampling: list[SamplingParams]
    seed_index: list[int]
    tool: ToolCallback | None
    slots: list[LiveSample | None]
    free: collections.deque[int]  # slots
    queue: collections.deque[int]  # prompts not prefilled yet
    pending: dict[int, cf.Future[str | None]] = dataclasses.field(default_factory=dict)
    results: dict[tuple[int, int], Completion] = dataclasses.field(default_factory=dict)
    # Prefilled prompts with samples still to insert: (prompt, prefix, row, samples to go).
    ready: collections.deque[tuple[int, Prefix, int, collections.deque[int]]] = dataclasses.field(
        default_factory=collections.deque
    )
    pool: cf.ThreadPoolExecutor | None = None
    on_finish: Callable[[int, Completion], object] | None = None
    refresh: Refresh | None = None
    version: int = 0  # of the params the next call samples with (tracked with `refresh`)

    def release(self, engine: Any) -> None:
        """Give back what the call still holds of `engine`'s KV pages: the slots still
        decoding and the prompts prefilled whose samples were not all inserted. Nothing after
        a call that ran to its end; after one an exception cut short (an `on_finish` or a
        scorer raising, Ctrl-C) the engine's pool outlives it, and the pages held would make
        the next call's samples wait for room that never frees (a false "needs more KV pages
        than the whole pool holds")."""
        for b, s in enumerate(self.slots):
            if s is not None:
                engine.release_slot(b)
                self.slots[b] = None
        while self.ready:
            _, prefix, row, _ = self.ready.popleft()
            engine.release_prompt(prefix, row)

    def finish(self, s: LiveSample, completion: Completion) -> None:
        """Record a finished sample and pass it to `on_finish`."""
        key = (s.prompt_index, s.sample_index)
        self.results[key] = completion
        self.report(key)

    def report(self, key: tuple[int, int]) -> None:
        """`on_finish(index in the prompt-major output, completion)` of a finished sample."""
        if self.on_finish is not None:
            prompt, sample = key
            self.on_finish(self.first_sample[prompt] + sample, self.results[key])

    @functools.cached_property
    def first_sample(self) -> list[int]:
        """Each prompt's first sample's index in the prompt-major output."""
        return [0, *itertools.accumulate(sp.n for sp in self.sampling)][:-1]

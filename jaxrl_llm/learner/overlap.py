"""Overlapped RL (`RLConfig.max_staleness = k >= 1`): a producer thread samples the next
steps' batches while the trainer computes the current one's experience and updates.

Staleness is fixed, not opportunistic: step s always samples with the weights after
`max(u0, s - 1 - k)` updates (u0: the updates the run started from, 0 or the resumed
checkpoint's step), so a run is as deterministic as a synchronous one (same batches, same
seeds, same weights for each; only the order of device work differs) and every sample lags
exactly `min(k, s - 1 - u0)` policy versions. The producer waits for those weights rather
than exceed the bound, so no sample is ever dropped for staleness and a batch of slow
(long) samples is trained on like any other: nothing biases training toward easy prompts.

Weights: the trainer's update donates its params, so each version the producer needs is
copied once (a jitted copy on the training layout; the LoRA base is shared, never copied)
and dropped once no later step samples with it: at most k + 1 copies of the trained params
are alive beside the trainer's. Each copy is bound to its version when it is published
(`rollout.sampler.PolicyWeights`) and the sampler checks that the version it received is
the one the step is sampled with, so a copy handed to the wrong step, or an update that
never reached the sampler, stops the run rather than passing for staleness.

Locks: `rollout_lock` is held by a batch's whole sampling and by a validation (the two share
the sampler and its weights); `_cond` guards the books (copies, finished batches, the data
iterator's state before each batch) and is never held while sampling.

Checkpoints (`checkpoint`): steps s + 1 ... s + k sample with weights older than a
checkpoint at step s holds, so the checkpoint waits until the producer has finished them and
saves them whole (`learner/ahead.py`), with the data iterator's state before step s + k + 1's
first prompt (not its state at save time: the producer may have drawn ahead). A resumed run
trains the saved batches first (`ready`) and samples from step s + k + 1 on, with the
checkpoint's weights, as the uninterrupted run does: it equals that run to the digit, and
every prompt of the data order is trained once. Only a batch being sampled with the
checkpoint's own weights is lost at a stop, and it is sampled again identically.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.learner import lora as lora_lib
from jaxrl_llm.rollout.sampler import PolicyWeights
from jaxrl_llm.types import Rollout

Batch = tuple[Rollout, dict[str, float]]  # a step's scored samples and its rollout metrics
# (step, the weights to sample it with, the version it expects) -> the batch and its metrics
Collect = Callable[[int, PolicyWeights, int], Batch]


class RolloutProducer:
    """Samples steps `first .. last` in order on its own thread; `take(step)` hands them to
    the trainer, `publish(updates, params)` receives the weights after each update. `ready`:
    batches of the first steps sampled before a stop (a checkpoint's), handed out as they
    are; sampling starts after them."""

    def __init__(
        self, collect: Collect, prompts: Any, *, first: int, last: int, k: int,
        ready: Mapping[int, Batch] | None = None,
    ):  # fmt: skip
        if k < 1:
            raise ValueError(f"RolloutProducer needs max_staleness >= 1, got {k}")
        ready = dict(ready or {})
        if sorted(ready) != list(range(first, first + len(ready))):
            raise ValueError(
                f"saved batches of steps {sorted(ready)} do not follow step {first - 1}"
            )
        self._collect, self._prompts = collect, prompts
        self._first, self._last, self._k = first, last, k
        self._sample_from = first + len(ready)
        self.rollout_lock = threading.Lock()
        self._cond = threading.Condition()
        self._weights: dict[int, PolicyWeights] = {}  # updates -> a copy of those weights
        self._done: dict[int, Batch] = ready
        self._data_state: dict[int, Any] = {}  # step -> iterator state before its prompts
        self._error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def start(self, trained: Any, frozen: Any) -> None:
        """Begin with the weights the run starts from (after `first - 1` updates)."""
        self.publish(self._first - 1, trained, frozen)
        self._thread.start()

    def needs(self, updates: int) -> bool:
        """Whether a step still to be sampled uses the weights after `updates` updates."""
        return self._updates_for(self._last) >= updates >= self._first - 1

    def publish(self, updates: int, trained: Any, frozen: Any) -> None:
        """The trainer's weights after `updates` updates: its trained params, copied here
        (the next update donates them), and with LoRA the frozen base, shared (never
        donated or changed); ignored when no step to come samples with them."""
        if not self.needs(updates):
            return
        copy = PolicyWeights(lora_lib.full_params(_copy(trained), frozen), updates + 1)
        with self._cond:
            self._weights[updates] = copy
            self._cond.notify_all()

    def take(self, step: int) -> tuple[Rollout, dict[str, float]]:
        """Step `step`'s scored batch and its rollout metrics, waiting for it (the wait is
        `timing/rollout_wait`: the trainer idle; `timing/sampler_wait` is the producer's wait
        for the weights the batch needed: the sampler idle)."""
        t0 = time.perf_counter()
        with self._cond:
            while step not in self._done and self._error is None:
                self._cond.wait()
            if step not in self._done:  # it failed sampling this step or an earlier one
                assert self._error is not None  # the wait ends on one or the other
                raise self._error  # as the synchronous loop would: same type, same text
            samples, metrics = self._done.pop(step)
            for done in [s for s in self._data_state if s <= step]:
                del self._data_state[done]  # a checkpoint from now on asks for a later one
        metrics["timing/rollout_wait"] = time.perf_counter() - t0
        return samples, metrics

    def checkpoint(self, step: int) -> tuple[Any, dict[int, Batch]]:
        """What a checkpoint after step `step`'s update records besides the weights: the
        batches of the steps that sample with older weights than these (step + 1 ... step
        + k), waited for (their weights are all published), and the data iterator's state
        once their prompts are drawn and no later step's."""
        ahead = range(step + 1, min(step + self._k, self._last) + 1)
        with self._cond:
            while not all(t in self._done for t in ahead) and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            after = ahead.stop
            if after in self._data_state:
                data = self._data_state[after]
            else:  # the producer has not begun that step and cannot while we hold the
                data = self._prompts.get_state()  # books (it records before it draws)
            return data, {t: self._done[t] for t in ahead}

    def close(self) -> None:
        """Stop after the batch being sampled (if any) and wait for the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _updates_for(self, step: int) -> int:
        return max(self._first - 1, step - 1 - self._k)

    def _run(self) -> None:
        try:
            for step in range(self._sample_from, self._last + 1):
                updates = self._updates_for(step)
                t_wait = time.perf_counter()
                with self._cond:
                    while updates not in self._weights and not self._stopping:
                        self._cond.wait()
                    waited = time.perf_counter() - t_wait  # the sampler idle
                    if self._stopping:
                        return
                    params = self._weights[updates]
                    for old in [u for u in self._weights if u < self._updates_for(step + 1)]:
                        del self._weights[old]  # no later step samples with these
                    self._data_state[step] = self._prompts.get_state()
                with self.rollout_lock:
                    t0 = time.perf_counter()
                    samples, metrics = self._collect(step, params, updates + 1)
                    metrics["timing/rollout"] = (
                        time.perf_counter() - t0 - metrics["timing/weight_sync"]
                    )
                metrics["timing/sampler_wait"] = waited
                del params  # this version's copy is no longer needed
                with self._cond:
                    self._done[step] = (samples, metrics)
                    self._cond.notify_all()
        except BaseException as e:  # handed to the trainer's next `take`
            with self._cond:
                self._error = e
                self._cond.notify_all()


@jax.jit
def _copy(tree: Any) -> Any:
    """New buffers, on the same shardings (a copy is elementwise)."""
    return jax.tree.map(jnp.copy, tree)

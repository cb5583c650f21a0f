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

Several processes: each host's producer samples its share of each batch on its own devices,
as the synchronous loop does, but a cross-host device collective entered from two threads
deadlocks (`sharding/hosts.py`, "Threads"). So the weights are staged by `publish`, on the
trainer's thread (`RolloutStage.stage_weights`: the sampler's cast and gather into one full
copy per host), and the producer's push and its gathers of the hosts' samples run none (its
exchanges go through the coordination service by tag).

Locks: `rollout_lock` is held by a batch's whole sampling and by a validation (the two share
the sampler and its weights; a validation after step s's update comes between the batches
of steps s + k and s + k + 1 on every host: `paused`); `_cond` guards the books (copies,
finished batches, the data iterator's state before each batch) and is never held while
sampling.

Checkpoints (`checkpoint`): steps s + 1 ... s + k sample with weights older than a
checkpoint at step s holds, so the checkpoint waits until the producer has finished them and
saves them whole (`learner/ahead.py`), with the data iterator's state before step s + k + 1's
first prompt (not its state at save time: the producer may have drawn ahead). A resumed run
trains the saved batches first (`ready`) and samples from step s + k + 1 on, with the
checkpoint's weights, as the uninterrupted run does: it equals that run to the digit, and
every prompt of the data order is trained once. Only a batch being sampled with the
checkpoint's own weights is lost at a stop, and it is sampled again identically. Saved
batches a resumed run has not reached (saved with a larger k, or past its last step) are
saved again with the data state after them, so no sampled prompt is skipped. A producer
that failed (a reward error on step f) does not stop a checkpoint or validation: as the
synchronous loop saves step s before sampling the next, the checkpoint holds the batches
before f and the data state before f's prompts, and the error reaches the trainer at f's
`take`; a run resumed from it samples f with the checkpoint's (newer) weights, so every
prompt is still trained once.

Partial rollouts (`RLConfig.partial_rollouts`, `partial=True`): a step starts with the
newest weights computed (at least those the bound asks), and whenever newer ones are
computed while it samples, the sampler continues the samples still decoding with them
(`refresh`, between two device calls; the JAX engine keeps the KV they have, computed with
the older weights; vLLM re-submits them), each token tagged with the version that sampled it
(`Completion.token_versions`). A copy counts once computed (`_computed`): it is published
when its update is dispatched, and handing it over earlier stalls the sampler in the push.
Every token then lags at most as much as without, usually less, and the logprobs the
sampler records are those of the distribution each token was actually drawn from, so the
importance weights (`AlgoConfig.is_cap`) correct exactly what happened. Where the swaps fall
follows timing, so such a run is not reproducible to the digit, and a resumed run trains
every prompt once but is not the uninterrupted run's twin.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.learner import lora as lora_lib
from jaxrl_llm.rollout.sampler import PolicyWeights, Refresh
from jaxrl_llm.types import Rollout

Batch = tuple[Rollout, dict[str, float]]  # a step's scored samples and its rollout metrics
# (step, the weights to sample it with, the version it expects, newer weights as they come
# (partial rollouts) or None) -> the batch and its metrics
Collect = Callable[[int, PolicyWeights, int, Refresh | None], Batch]


class RolloutProducer:
    """Samples steps `first .. last` in order on its own thread; `take(step)` hands them to
    the trainer, `publish(updates, params)` receives the weights after each update. `ready`:
    batches of the first steps sampled before a stop (a checkpoint's), handed out as they
    are; sampling starts after them. `partial`: partial rollouts (the module docstring)."""

    def __init__(
        self, collect: Collect, prompts: Any, *, first: int, last: int, k: int,
        ready: Mapping[int, Batch] | None = None, partial: bool = False,
        stage: Callable[[PolicyWeights], PolicyWeights] | None = None,
    ):  # fmt: skip
        if k < 1:
            raise ValueError(f"RolloutProducer needs max_staleness >= 1, got {k}")
        ready = dict(ready or {})
        if sorted(ready) != list(range(first, first + len(ready))):
            raise ValueError(
                f"saved batches of steps {sorted(ready)} do not follow step {first - 1}"
            )
        self._collect, self._prompts = collect, prompts
        self._first, self._last, self._k, self._partial = first, last, k, partial
        self._stage = stage
        self._sample_from = first + len(ready)
        self.rollout_lock = threading.Lock()
        self._cond = threading.Condition()
        self._weights: dict[int, PolicyWeights] = {}  # updates -> a copy of those weights
        self._done: dict[int, Batch] = ready
        self._data_state: dict[int, Any] = {}  # step -> iterator state before its prompts
        self._error: BaseException | None = None
        self._stopping = False
        self._sampled_all = False  # the last step is sampled: no weights are needed any more
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def start(self, trained: Any, frozen: Any) -> None:
        """Begin with the weights the run starts from (after `first - 1` updates)."""
        self.publish(self._first - 1, trained, frozen)
        self._thread.start()

    def needs(self, updates: int) -> bool:
        """Whether a step still to be sampled uses the weights after `updates` updates (with
        partial rollouts, any the last step may still swap to, until it is sampled). With
        several processes (`stage`: a copy may be a collective) the answer must be every
        host's alike, so it is read from the step numbers only, never from the producer's
        progress, which differs by host."""
        if self._stage is None and self._sampled_all:  # read unlocked: a stale False, a copy
            return False
        newest = self._last - 1 if self._partial else self._updates_for(self._last)
        return newest >= updates >= self._first - 1

    def publish(self, updates: int, trained: Any, frozen: Any) -> None:
        """The trainer's weights after `updates` updates: its trained params, copied here
        (the next update donates them), and with LoRA the frozen base, shared (never
        donated or changed); ignored when no step to come samples with them. With `stage`
        (several processes) the copy is staged here, on the trainer's thread: the sampler's
        push from the producer's thread then runs no cross-host collective."""
        if not self.needs(updates):
            return
        copy = PolicyWeights(lora_lib.full_params(_copy(trained), frozen), updates + 1)
        if self._stage is not None:  # staged from the copy: a stage that moves nothing (a
            copy = self._stage(copy)  # layout already one copy per host) hands back its input
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

    @contextlib.contextmanager
    def paused(self, step: int) -> Iterator[None]:
        """The sampler to the caller (a validation with the weights after step `step`'s
        update, which the trainer publishes only after it) between the batches of steps
        step + k and step + k + 1: waits for the first to be sampled; the second needs those
        weights, so cannot begin. The same point on every host: left to the lock's timing,
        one host's validation (cross-host collectives) could run while another's producer
        holds the lock for a batch whose hosts' samples are exchanged with the first host's
        producer, blocked on that host's validation: a deadlock."""
        with self._cond:
            self._wait_sampled(range(step + 1, min(step + self._k, self._last) + 1))
        with self.rollout_lock:
            yield

    def _wait_sampled(self, steps: range) -> range:
        """(Holding `_cond`.) Until the batches of `steps` are sampled (not yet taken) or the
        producer has stopped on an error; the steps sampled before the first missing one. The
        error is left to that step's `take`: a checkpoint or validation goes ahead, as in the
        synchronous loop, where that step's sampling comes after them."""
        sampled = lambda: all(t in self._done for t in steps)
        while not sampled() and self._error is None:
            self._cond.wait()
        return range(steps.start, next((t for t in steps if t not in self._done), steps.stop))

    def checkpoint(self, step: int) -> tuple[Any, dict[int, Batch]]:
        """What a checkpoint after step `step`'s update records besides the weights: the
        batches of the steps that sample with older weights than these (step + 1 ... step
        + k, waited for: their weights are all published) and any later saved batch this run
        was resumed with (`ready`: saved with a larger k, or past this run's last step), and
        the data iterator's state once their prompts are drawn and no later step's. If the
        producer failed on one of these steps, the batches before it and the state before
        its prompts (the module docstring)."""
        last = max(min(step + self._k, self._last), self._sample_from - 1)
        with self._cond:  # the producer cannot take a batch back: they are all still here
            ahead = self._wait_sampled(range(step + 1, last + 1))
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
                t_wait = time.perf_counter()
                with self._cond:
                    updates = self._wait_for_weights(step)
                    waited = time.perf_counter() - t_wait  # the sampler idle
                    if updates is None:
                        return
                    params = self._weights[updates]
                    self._drop_older(max(updates, self._updates_for(step + 1)))
                    self._data_state[step] = self._prompts.get_state()
                refresh = self._refresher(updates) if self._partial else None
                with self.rollout_lock:
                    t0 = time.perf_counter()
                    samples, metrics = self._collect(step, params, updates + 1, refresh)
                    metrics["timing/rollout"] = (
                        time.perf_counter() - t0 - metrics["timing/weight_sync"]
                    )
                metrics["timing/sampler_wait"] = waited
                del params  # this version's copy is no longer needed
                with self._cond:
                    self._done[step] = (samples, metrics)
                    self._cond.notify_all()
            with self._cond:  # the copies left (partial rollouts: those no sample swapped to)
                self._sampled_all = True
                self._weights.clear()
        except BaseException as e:  # handed to the trainer's next `take`
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _wait_for_weights(self, step: int) -> int | None:
        """(Holding `_cond`.) The updates whose weights step `step` starts sampling with:
        those the bound asks, or with partial rollouts the newest computed (else the oldest
        the bound allows); None at a stop."""
        floor = self._updates_for(step)
        while not any(u >= floor for u in self._weights) and not self._stopping:
            self._cond.wait()
        if self._stopping:
            return None
        if not self._partial:
            return floor
        allowed = [u for u in self._weights if u >= floor]
        computed = [u for u in allowed if _computed(self._weights[u])]
        return max(computed) if computed else min(allowed)

    def _drop_older(self, updates: int) -> None:
        """(Holding `_cond`.) Forget the copies older than `updates`: no later step (nor, with
        partial rollouts, a sample that may swap) uses them."""
        for old in [u for u in self._weights if u < updates]:
            del self._weights[old]

    def _refresher(self, updates: int) -> Refresh:
        """Partial rollouts: the newest published weights whenever they are newer than those
        the step is sampling with (starting from `updates`) and computed, else None. A copy
        is published when its update is dispatched; handing it over before the update has
        run would stall the sampler on the push until it has."""
        current = updates

        def refresh() -> PolicyWeights | None:
            nonlocal current
            with self._cond:
                newest = max(self._weights, default=current)
                if newest <= current or not _computed(self._weights[newest]):
                    return None
                current = newest
                self._drop_older(newest)
                return self._weights[newest]

        return refresh


def staleness_metrics(samples: Rollout, step: int) -> dict[str, float]:
    """`rollout/staleness/{mean,max}`: the policy versions the trained tokens of step `step`'s
    batch lag behind its update (one version for the whole batch unless partial rollouts
    tagged its tokens); with tags, `rollout/partial_frac` too: the share of samples whose
    trained tokens come from more than one version."""
    lag = float(step - samples.policy_version)
    if all(c.token_versions is None for c in samples.completions):
        return {"rollout/staleness/mean": lag, "rollout/staleness/max": lag}
    lags, mixed = [], 0
    for c in samples.completions:
        versions = c.token_versions
        if versions is None:
            versions = np.full(len(c.token_ids), samples.policy_version, np.int32)
        trained = versions[np.asarray(c.response_mask) == 1]
        lags.append(step - trained)
        mixed += int(len(np.unique(trained)) > 1)
    every = np.concatenate(lags)
    return {
        "rollout/staleness/mean": float(every.mean()) if every.size else lag,
        "rollout/staleness/max": float(every.max()) if every.size else lag,
        "rollout/partial_frac": mixed / len(samples.completions),
    }


def _computed(weights: PolicyWeights) -> bool:
    """Whether every array of a published copy is computed (its update and copy have run)."""
    arrays = [x for x in jax.tree.leaves(weights.params) if isinstance(x, jax.Array)]
    # `is_ready` is the concrete array's (jaxlib's ArrayImpl), not in `jax.Array`'s stub.
    return all(x.is_ready() for x in arrays)  # pyright: ignore[reportAttributeAccessIssue]


@jax.jit
def _copy(tree: Any) -> Any:
    """New buffers, on the same shardings (a copy is elementwise)."""
    return jax.tree.map(jnp.copy, tree)

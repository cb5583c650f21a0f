"""Scoring a batch with a hard wall-clock limit per sample: `RewardPool`.

Each worker is a separate process (started with "spawn": safe beside JAX's threads) that
scores one sample at a time in its main thread, so math_verify's own signal timeouts work
there as a first line. When a sample still overruns `timeout_s` (C-level work that signals
cannot interrupt, e.g. a huge integer power), its worker is killed and replaced, and the
sample scores `timeout_value`. Other samples are unaffected; the batch never stalls.
Each worker reports "ready" after its imports, and a sample's clock starts only then, so a
slow start (a replacement worker: ~0.6 s here to spawn and import math_verify) never turns
into a false timeout.

A reward that raises, or returns NaN, inf or a non-number (`registry.finite_score` raises
then, naming the reward and the value), scores `timeout_value` too, and is reported, never
hidden: each failed sample is in `last_failures` (a `ScoreFailure`), the first traceback of
each exception type is logged once per pool (so is an exception on the parent's side of a
sample, e.g. an example that cannot be pickled to the worker: an "error" too, after which that
worker is replaced and scores the rest), and `check_errors` stops a run when more than
`max_error_frac` of a batch raised (a reward bug must not silently train on constant scores).

A reward that reports its parts (`registry.Reward`, `registry.CombinedReward`: `part_names`
and `scored_parts`) is broken down per reward in `last_parts` (`RewardPart`): each part's
unweighted score of each sample and the seconds the workers spent on it, timed inside the
workers around each reward's call and summed over samples and workers (work, not wall time:
with several workers it can exceed the call's wall time). A sample that timed out or raised
has no part scores (NaN) and adds no seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import queue
import signal
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from jaxrl_llm.rewards.registry import finite_score

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class ScoreFailure:
    """Why a sample has no score. kind: "timeout", "error" (the reward raised, or the pool
    failed to hand the sample over, e.g. an unpicklable example; `error_type` and `traceback`
    from where it was raised) or "worker_died" (e.g. killed for memory)."""

    kind: str
    message: str = ""
    error_type: str = ""
    traceback: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


class RewardErrors(RuntimeError):
    """More than `max_error_frac` of a batch's samples made the reward raise."""


@dataclasses.dataclass(frozen=True)
class RewardPart:
    """One reward of a combination in one `score` call: its unweighted score of each sample
    [B] (NaN where it has none: the sample timed out or raised) and the seconds spent
    scoring with it."""

    scores: np.ndarray
    seconds: float
    # What the reward counted in the call (a judge's retries, unparsed verdicts, ...),
    # reported as `reward/<name>/<count>`.
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)


def _serve(conn, reward_fn: Callable[[str, Any], float]) -> None:
    """A worker's loop: scores what the parent sends until it sends None or is gone. A parent
    that went away (its end of the pipe closed: the run stopped, by SIGTERM or otherwise,
    while this worker was starting or scoring) ends the worker quietly, not with a
    traceback in the run's log. A terminal's Ctrl-C is SIGINT to its whole process group,
    the workers too: the parent decides the stop and closes the pool, so a worker ignores
    it rather than end in a KeyboardInterrupt traceback, idle or not (from here on: one
    arriving while the worker still imports, its first half second, still ends it so)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        conn.send(("ready", None))  # imports done: the caller's clock starts after this
        scored_parts = getattr(reward_fn, "scored_parts", None)
        name = _reward_name(reward_fn)
        while (item := conn.recv()) is not None:
            response, example = item
            try:
                if scored_parts is not None:  # (total, {name: (score, seconds)})
                    total, parts = scored_parts(response, example)
                else:
                    total, parts = reward_fn(response, example), {}
                conn.send(("ok", (finite_score(name, total), parts)))
            except Exception as e:  # a reward bug must not kill the worker: report it
                conn.send(("error", _error_value(e)))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


def _reward_name(reward_fn: Callable[..., Any]) -> str:
    """How errors name `reward_fn`: a `Reward`'s name, else "module:function"."""
    names = getattr(reward_fn, "part_names", None)
    if names:
        return " + ".join(names)
    fn = getattr(reward_fn, "func", reward_fn)  # a functools.partial
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else repr(reward_fn)


def _error_value(e: Exception) -> tuple[str, str, str]:
    """(error type, message, traceback) of `e`, being handled: an "error" status's value."""
    kind = f"{type(e).__module__}.{type(e).__qualname__}"
    return kind, f"{type(e).__name__}: {e}", traceback.format_exc()


class _Worker:
    """One worker process and its pipe. `closing` is the pool's: once set, a worker that
    died or was killed is not started again."""

    def __init__(self, ctx, reward_fn, closing: threading.Event):
        self._ctx, self._reward_fn, self._closing = ctx, reward_fn, closing
        self._start()

    def _start(self) -> None:
        self.ready = False
        self.conn, child = self._ctx.Pipe()
        self.process = self._ctx.Process(target=_serve, args=(child, self._reward_fn), daemon=True)
        self.process.start()
        child.close()

    def score(self, response: str, example: Any, timeout_s: float) -> tuple[str, Any]:
        try:
            if not self.ready:  # a fresh worker's start-up is not charged to the sample
                if not self.conn.poll(STARTUP_TIMEOUT_S):
                    raise OSError("worker did not start")
                self.conn.recv()
                self.ready = True
            self.conn.send((response, example))
            if self.conn.poll(timeout_s):
                return self.conn.recv()
            status: tuple[str, Any] = ("timeout", None)
        except (EOFError, OSError) as e:  # the worker died (e.g. out of memory)
            status = ("worker_died", str(e))
        self.restart()
        return status

    def restart(self) -> None:
        self.kill()
        self.conn.close()
        if not self._closing.is_set():
            self._start()

    def kill(self) -> None:
        self.process.kill()
        self.process.join()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class Scorer(Protocol):
    """What the RL stage and `eval` score samples with: a `RewardPool` (rule rewards in worker
    processes) or `rewards.combined.ModelAndRuleRewards` (reward models on device, plus a pool)."""

    def score(
        self, responses: Sequence[str], examples: Sequence[Mapping[str, Any]]
    ) -> Sequence[float] | np.ndarray: ...

    @property
    def last_failures(self) -> Mapping[int, ScoreFailure]: ...

    @property
    def last_parts(self) -> Mapping[str, RewardPart]:
        """The last `score` call per reward, by metric name (docs/rewards.md)."""
        ...

    def check_errors(self, errors: int, total: int, first_error: str = "") -> None: ...

    def close(self) -> None: ...


class RewardPool:
    """Scores (response, example) pairs in `num_workers` processes with a hard time limit.

    `reward_fn(response, example) -> float` must be picklable: a module-level function, a
    functools.partial of one, a `registry.Reward` or `registry.combine_rewards(...)`. Samples
    that time out or raise score `timeout_value`; `last_failures` says which and why, and
    `last_parts` each reward's scores and seconds (when `reward_fn` reports its parts).
    """

    def __init__(
        self,
        reward_fn: Callable[[str, Any], float],
        *,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        timeout_value: float = -1.0,
        max_error_frac: float = 0.5,
    ):
        if not 0.0 <= max_error_frac <= 1.0:
            raise ValueError(f"max_error_frac must be in [0, 1], got {max_error_frac!r}")
        ctx = multiprocessing.get_context("spawn")
        self.timeout_s = timeout_s
        self.timeout_value = timeout_value
        self.max_error_frac = max_error_frac
        self._closing = threading.Event()
        self._drains: list[threading.Thread] = []  # the threads of the last `score`
        self._workers = [_Worker(ctx, reward_fn, self._closing) for _ in range(num_workers)]
        self.part_names: tuple[str, ...] = tuple(getattr(reward_fn, "part_names", ()))
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self.last_failures: dict[int, ScoreFailure] = {}
        self.last_parts: dict[str, RewardPart] = {}

    def score(self, responses: Sequence[str], examples: Sequence[Mapping[str, Any]]) -> list[float]:
        """Each response's score against its example (the data row); failures are recorded
        in `last_failures` and the first traceback of each exception type is logged."""
        if len(responses) != len(examples):
            raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
        with self._lock:  # one batch at a time; its samples spread over the workers
            tasks: queue.SimpleQueue[int] = queue.SimpleQueue()
            for i in range(len(responses)):
                tasks.put(i)
            scores: list[float] = [self.timeout_value] * len(responses)
            failures: dict[int, ScoreFailure] = {}
            parts: dict[int, Mapping[str, tuple[float, float]]] = {}

            def drain(worker: _Worker) -> None:
                while not self._closing.is_set():
                    try:
                        i = tasks.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        status, value = worker.score(responses[i], examples[i], self.timeout_s)
                    except Exception as e:  # e.g. the example cannot be pickled to the worker
                        error_type, message, trace = _error_value(e)
                        failures[i] = ScoreFailure("error", message, error_type, trace)
                        worker.restart()  # its pipe's state is unknown: start afresh
                        continue
                    if status == "ok":
                        scores[i], parts[i] = value
                    elif status == "error":
                        failures[i] = ScoreFailure("error", value[1], value[0], value[2])
                    else:
                        failures[i] = ScoreFailure(status, value or "")

            threads = [threading.Thread(target=drain, args=(w,)) for w in self._workers]
            self._drains = threads
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self.last_failures = dict(sorted(failures.items()))
            self.last_parts = self._parts(parts, len(responses))
            self._log_new_errors()
            return scores

    def _parts(
        self, parts: Mapping[int, Mapping[str, tuple[float, float]]], n: int
    ) -> dict[str, RewardPart]:
        """Each sample's {name: (score, seconds)} as one `RewardPart` per name."""
        out = {}
        for name in self.part_names:
            scores = np.full(n, np.nan)
            seconds = 0.0
            for i, sample in parts.items():
                scores[i], dt = sample[name]
                seconds += dt
            out[name] = RewardPart(scores, seconds)
        return out

    def _log_new_errors(self) -> None:
        for failure in self.last_failures.values():
            if failure.kind == "error" and failure.error_type not in self._logged:
                self._logged.add(failure.error_type)
                log.error(
                    "the reward raised %s (logged once per exception type; every failed "
                    "sample scores %s and is counted in reward/errors):\n%s",
                    failure.error_type, self.timeout_value, failure.traceback.rstrip(),
                )  # fmt: skip

    def check_errors(self, errors: int, total: int, first_error: str = "") -> None:
        """Raises `RewardErrors` when more than `max_error_frac` of `total` samples raised.
        The caller passes counts over the whole batch (all hosts), so every host decides
        alike."""
        if total and errors / total > self.max_error_frac:
            raise RewardErrors(
                f"the reward raised on {errors} of {total} samples of a batch, more than "
                f"RewardConfig.max_error_frac = {self.max_error_frac}; first error: "
                f"{first_error or 'see the traceback logged above'}. Fix the reward (the "
                "first traceback of each exception type is in the log), or raise "
                "RewardConfig.max_error_frac to keep training with those samples at "
                f"{self.timeout_value}."
            )

    def close(self) -> None:
        """Ends the workers. A `score` interrupted in the caller's thread (SIGTERM, Ctrl-C:
        the exception leaves its join) leaves its threads talking to the workers; those are
        killed first, so each thread's wait ends at once and it stops (no new sample, no
        worker started again), and only then is any pipe closed: never one a thread is
        using, or one the process no longer has."""
        self._closing.set()
        busy = [t for t in self._drains if t.is_alive()]
        if busy:
            for worker in self._workers:
                worker.kill()
            for thread in busy:
                thread.join()
        for worker in self._workers:
            worker.close()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Scoring a batch with a hard wall-clock limit per sample: `RewardPool`.

Each worker is a separate process (started with "spawn": safe beside JAX's threads) that
scores one sample at a time in its main thread, so math_verify's own signal timeouts work
there as a first line. When a sample still overruns `timeout_s` (C-level work that signals
cannot interrupt, e.g. a huge integer power), its worker is killed and replaced, and the
sample scores `timeout_value`. Other samples are unaffected; the batch never stalls.
Each worker reports "ready" after its imports, and a sample's clock starts only then, so a
slow start (a replacement worker: ~0.6 s here to spawn and import math_verify) never turns
into a false timeout.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

STARTUP_TIMEOUT_S = 120.0


def _serve(conn, reward_fn: Callable[[str, Any], float]) -> None:
    conn.send(("ready", None))  # imports done: the caller's clock starts after this
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            return
        response, ground_truth = item
        try:
            conn.send(("ok", float(reward_fn(response, ground_truth))))
        except Exception as e:  # a reward bug must not kill the worker silently
            conn.send(("error", f"{type(e).__name__}: {e}"))


class _Worker:
    def __init__(self, ctx, reward_fn):
        self._ctx, self._reward_fn = ctx, reward_fn
        self._start()

    def _start(self) -> None:
        self.ready = False
        self.conn, child = self._ctx.Pipe()
        self.process = self._ctx.Process(target=_serve, args=(child, self._reward_fn), daemon=True)
        self.process.start()
        child.close()

    def score(self, response: str, ground_truth: Any, timeout_s: float) -> tuple[str, Any]:
        try:
            if not self.ready:  # a fresh worker's start-up is not charged to the sample
                if not self.conn.poll(STARTUP_TIMEOUT_S):
                    raise OSError("worker did not start")
                self.conn.recv()
                self.ready = True
            self.conn.send((response, ground_truth))
            if self.conn.poll(timeout_s):
                return self.conn.recv()
            status: tuple[str, Any] = ("timeout", None)
        except (EOFError, OSError) as e:  # the worker died (e.g. out of memory)
            status = ("error", f"worker died: {e}")
        self.restart()
        return status

    def restart(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()
        self._start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class RewardPool:
    """Scores (response, ground_truth) pairs in `num_workers` processes with a hard limit.

    reward_fn must be picklable: a module-level function, a functools.partial of one, or
    `registry.combine_rewards(...)`. Samples that time out or raise score `timeout_value`
    (default -1.0, math_reward's incorrect value); `last_failures` says which and why.
    """

    def __init__(
        self,
        reward_fn: Callable[[str, Any], float],
        *,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        timeout_value: float = -1.0,
    ):
        ctx = multiprocessing.get_context("spawn")
        self.timeout_s = timeout_s
        self.timeout_value = timeout_value
        self._workers = [_Worker(ctx, reward_fn) for _ in range(num_workers)]
        self._lock = threading.Lock()
        self.last_failures: dict[int, str] = {}

    def score(self, responses: Sequence[str], ground_truths: Sequence[Any]) -> list[float]:
        if len(responses) != len(ground_truths):
            raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
        with self._lock:  # one batch at a time; its samples spread over the workers
            tasks: queue.SimpleQueue[int] = queue.SimpleQueue()
            for i in range(len(responses)):
                tasks.put(i)
            scores: list[float] = [self.timeout_value] * len(responses)
            failures: dict[int, str] = {}

            def drain(worker: _Worker) -> None:
                while True:
                    try:
                        i = tasks.get_nowait()
                    except queue.Empty:
                        return
                    status, value = worker.score(responses[i], ground_truths[i], self.timeout_s)
                    if status == "ok":
                        scores[i] = value
                    else:
                        failures[i] = status if value is None else f"{status}: {value}"

            threads = [threading.Thread(target=drain, args=(w,)) for w in self._workers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self.last_failures = failures
            return scores

    def close(self) -> None:
        for worker in self._workers:
            worker.close()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""The run's scorer when rewards include models: reward models and LLM judges scored on
device beside the rule rewards' worker pool, summed with their weights (`ModelAndRuleRewards`,
built by `rewards.config.build_rewards`); a scorer's NaN or inf fails its sample by the rule
rewards' own rule (`registry.score_error`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.rewards.model_config import metric_names
from jaxrl_llm.rewards.pool import RewardErrors, RewardPart, RewardPool, ScoreFailure
from jaxrl_llm.rewards.registry import score_error

log = logging.getLogger(__name__)

# A failed sample's score and the stop rule of `ModelAndRuleRewards` without a rule pool:
# RewardConfig.incorrect's and .max_error_frac's defaults.
DEFAULT_INCORRECT, DEFAULT_MAX_ERROR_FRAC = 0.0, 0.5
SCORER_FIX = (
    "a reward model or judge must give finite scores; the sample scores "
    "RewardConfig.incorrect, as when a rule reward raises (check the checkpoint's weights "
    "and the scorer's dtype)"
)


class ModelAndRuleRewards:
    """sum_i weight_i * reward_i over device scorers (reward models and LLM judges, scored
    here, on device) and the rule rewards' `RewardPool` (already weighted; None when there
    are none), with the pool's interface: `score`, `last_failures`, `last_parts`,
    `check_errors`, `close`.

    A device scorer has `name` ("rm:<folder>", "judge:<folder>"), `score(responses,
    examples) -> float32 [B]`, `close()` and, optionally, `last_counts` (what its last call
    counted, e.g. a judge's retries). A `score` call runs the pool in a thread while the
    scorers score in the caller's (its threads mostly wait on the worker processes, so the
    two overlap), then adds pool + weight * scorer in the same order as one after the other
    would. `last_parts`: the pool's parts and each scorer's `RewardPart` (its score,
    unweighted, the wall time of its `score` and its counts), under "rm:<folder basename>"
    or "judge:<folder basename>" (`model_config.metric_names`). `close` closes the pool and
    every scorer.

    A scorer's NaN or +/-inf fails that sample as a rule reward's does in the pool
    (`registry.score_error`, the rule both obey): an "error" in `last_failures` naming the
    scorer and the sample, no score from that scorer in `last_parts` (NaN), logged once per
    scorer. A failed sample, the pool's or a scorer's, scores `incorrect` (never `incorrect`
    plus another reward's score); more than `max_error_frac` of a batch failing stops the run
    (`check_errors`). Both default to the pool's (`timeout_value`, `max_error_frac`: the same
    `RewardConfig`'s), else RewardConfig's defaults."""

    def __init__(
        self,
        pool: RewardPool | None,
        models: Sequence[tuple[Any, float]],
        *,
        incorrect: float | None = None,
        max_error_frac: float | None = None,
    ):
        self.pool, self.models = pool, list(models)
        names = metric_names([model.name for model, _ in self.models])
        self._names = [names[model.name] for model, _ in self.models]
        if incorrect is None:
            incorrect = pool.timeout_value if pool is not None else DEFAULT_INCORRECT
        if max_error_frac is None:
            max_error_frac = pool.max_error_frac if pool is not None else DEFAULT_MAX_ERROR_FRAC
        self.incorrect, self.max_error_frac = incorrect, max_error_frac
        self.last_parts: dict[str, RewardPart] = {}
        self.last_failures: dict[int, ScoreFailure] = {}
        self._logged: set[str] = set()  # scorers whose first non-finite score was logged

    def score(self, responses: Sequence[str], examples: Sequence[Mapping[str, Any]]) -> np.ndarray:
        rules: list[Any] = []  # the pool's scores, or what it raised
        thread = None
        if self.pool is not None:
            pool = self.pool

            def score_rules() -> None:
                try:
                    rules.append(pool.score(responses, examples))
                except BaseException as e:  # re-raised in the caller's thread below
                    rules.append(e)

            thread = threading.Thread(target=score_rules, name="rule-rewards", daemon=True)
            thread.start()
        parts: dict[str, RewardPart] = {}
        try:
            for name, (model, _) in zip(self._names, self.models, strict=True):
                t0 = time.perf_counter()
                scores = np.asarray(model.score(responses, examples))
                counts = dict(getattr(model, "last_counts", {}))
                parts[name] = RewardPart(scores, time.perf_counter() - t0, counts)
        finally:
            if thread is not None:
                thread.join()
        total = np.zeros(len(responses), np.float32)
        failures: dict[int, ScoreFailure] = {}
        if self.pool is not None:
            if isinstance(rules[0], BaseException):
                raise rules[0]
            total += np.asarray(rules[0], np.float32)
            failures = dict(self.pool.last_failures)
            parts = {**self.pool.last_parts, **parts}
        for name, (model, weight) in zip(self._names, self.models, strict=True):
            scores = self._fail_non_finite(model.name, parts[name].scores, failures)
            parts[name] = dataclasses.replace(parts[name], scores=scores)
            with np.errstate(over="ignore"):  # an overflow is failed below
                total += np.float32(weight) * scores
        self._fail_overflow(total, failures)
        total[list(failures)] = self.incorrect
        self.last_failures, self.last_parts = dict(sorted(failures.items())), parts
        return total

    def _fail_overflow(self, total: np.ndarray, failures: dict[int, ScoreFailure]) -> None:
        """A sample whose weighted total is beyond float32 though every part is a score (a
        large weight times a large score) fails as a non-finite score does: inf would reach
        the advantages as NaN."""
        for i in np.flatnonzero(~np.isfinite(total)).tolist():
            message = (
                f"ValueError: sample {i}'s weighted reward total {total[i]} is beyond "
                "float32; lower the weights (RewardConfig.weights) or the scores"
            )
            failures.setdefault(i, ScoreFailure("error", message, "builtins.ValueError"))

    def _fail_non_finite(
        self, name: str, scores: np.ndarray, failures: dict[int, ScoreFailure]
    ) -> np.ndarray:
        """Scorer `name`'s `scores` [B], NaN (no score) where one is not a score
        (`score_error`); each such sample is added to `failures` unless it failed already."""
        where = f" of the {len(scores)} scored in this call"
        # Only the samples that may fail the rule are put to it (not every score, every call).
        numeric = scores.dtype.kind in "fiub"
        suspects = np.flatnonzero(~np.isfinite(scores)) if numeric else range(len(scores))
        values = scores.tolist() if len(suspects) else []
        errors = {int(i): score_error(name, values[i], where=f" on sample {i}{where}",
                                      fix=SCORER_FIX) for i in suspects}  # fmt: skip
        errors = {i: e for i, e in errors.items() if e is not None}
        for i, error in errors.items():
            message = f"{type(error).__name__}: {error}"
            failures.setdefault(
                i, ScoreFailure("error", message, f"builtins.{type(error).__name__}")
            )
            if name not in self._logged:
                self._logged.add(name)
                log.error("%s (logged once per scorer; counted in reward/errors)", message)
        if not errors:
            return scores
        out = np.array(scores, np.result_type(scores, np.float32))  # the scorer's array kept
        out[list(errors)] = np.nan
        return out

    @property
    def last_verdicts(self) -> dict[str, list[str]]:
        """{judge's metric name: its verdict text per sample} of the last call (judges only)."""
        return {
            name: list(model.last_verdicts)
            for name, (model, _) in zip(self._names, self.models, strict=True)
            if hasattr(model, "last_verdicts")
        }

    def check_errors(self, errors: int, total: int, first_error: str = "") -> None:
        """`RewardPool.check_errors`'s rule over the pool's and the scorers' failures."""
        if total and errors / total > self.max_error_frac:
            raise RewardErrors(
                f"the rewards failed on {errors} of {total} samples of a batch, more than "
                f"RewardConfig.max_error_frac = {self.max_error_frac}; first error: "
                f"{first_error or 'see the log above'}. Fix the reward or the model, or "
                "raise RewardConfig.max_error_frac to keep training with those samples at "
                f"{self.incorrect}."
            )

    def close(self) -> None:
        """Closes the pool and every scorer, each even when another's close raises."""
        with contextlib.ExitStack() as stack:
            for close in (*([self.pool.close] if self.pool else []),
                          *(model.close for model, _ in self.models)):  # fmt: skip
                stack.callback(close)

    def __enter__(self) -> ModelAndRuleRewards:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

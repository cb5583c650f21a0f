"""Health checks on a run's metrics, from the danger signs RL-for-LLM practitioners read.

`HealthMonitor.check(step, metrics)` is called once per step with the step's metric dict
(verl names, as written to `metrics.jsonl`). Each kind of warning fires at most once per
run, is logged with `logging.warning`, and carries the metric values and a hint naming the
gin knob to try. Checks and their signs:

- `non_finite:<family>`: NaN or Inf in a metric, once per family (the name's first part:
  `actor`, `critic`, `reward`, `timing`, ...), at once; so a NaN timing or reward mean does
  not hide a NaN loss later. Only the update's families (`actor`, `critic`) say that the
  trainer skipped the update. A NaN `reward/<name>/mean` is not counted: it means no sample
  was scored by that reward in the step (docs/rewards.md), not a divergence.
- `kl_explosion`: |actor/kl_loss| or |actor/ppo_kl| above `kl_max`, or above
  `kl_spike_factor` x its running median and above `kl_spike_floor` (at once).
- `entropy_collapse`: actor/entropy below `entropy_collapse_frac` x its early mean, or below
  `entropy_floor`, for `patience` steps.
- `pg_loss_trend`: actor/pg_loss rising over the last `trend_window` steps and now above
  0: Kendall tau between step and loss above `trend_tau`, a positive Theil-Sen slope (both
  rank/median based, so one outlier neither triggers nor hides it), and the median of the
  last quarter of the window > 0. A loss climbing from below towards 0 is not a danger sign:
  with length-weighted token-mean aggregation GRPO's pg_loss starts negative and settles
  near 0 as the policy sharpens (seen on the built-in run).
- `clipfrac_high`: actor/pg_clipfrac above `clipfrac_max` for `patience` steps.
- `all_equal_groups`: batch/all_equal_groups_frac (the fraction of prompt groups whose G
  rewards are all equal) above `all_equal_max` for `patience` steps. The loop logs it only
  for an estimator with a group baseline (GRPO, RLOO, REINFORCE++-baseline) and G > 1
  (`rl_loop.group_metrics`).
- `length_at_cap`: response_length/clip_ratio above `length_clip_max` for `patience` steps.

The cost per step is a few dict lookups plus, once the pg_loss window is full, one
O(trend_window^2) numpy pass (190 pairs at the default window of 20).
"""

from __future__ import annotations

import collections
import logging
import math
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

KL_KEYS = ("actor/kl_loss", "actor/ppo_kl")
UPDATE_FAMILIES = ("actor", "critic")  # a non-finite loss or gradient skips their update


def _nothing_scored(key: str, value: float) -> bool:
    """`reward/<name>/mean` is NaN when the reward scored no sample in the step."""
    return math.isnan(value) and key.startswith("reward/") and key.endswith("/mean")


def _as_float(v: Any) -> float | None:
    """A metric value as a float; `metrics.jsonl` stores non-finite values as "nan"/"inf"."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class HealthMonitor:
    """Watches a run's metrics and warns, once per kind, when a danger sign shows.

    Args:
      kl_max: absolute ceiling on |actor/kl_loss| and |actor/ppo_kl| (nats per token).
      kl_spike_factor: warn when a KL metric exceeds this multiple of the median of its
        last `kl_history` finite values (needs `min_history` of them)...
      kl_spike_floor: ...and is above this absolute value, so tiny early KLs (policy ==
        reference at step 1) do not count as spikes.
      kl_history: length of the running window for the KL median.
      entropy_collapse_frac: warn when actor/entropy falls below this fraction of its early
        value (the mean of its first `min_history` finite values)...
      entropy_floor: ...or below this absolute value (nats), for `patience` steps.
      trend_window: number of most recent pg_loss values in the trend test.
      trend_tau: Kendall rank correlation between step and pg_loss above which the trend
        counts as upward (robust to outliers; ~3.7 standard errors of tau for pure noise
        at the default window of 20).
      clipfrac_max: actor/pg_clipfrac level read as "near 1".
      all_equal_max: batch/all_equal_groups_frac level above which most prompt groups carry
        no learning signal under a group baseline (GRPO, RLOO).
      length_clip_max: response_length/clip_ratio level read as "stuck at the cap".
      patience: consecutive steps a level condition (entropy, clip fraction, all-equal
        groups, length at cap) must hold before it warns; spikes and NaNs warn at once.
      min_history: finite values needed before the relative tests (KL spike, entropy
        collapse) apply.
    """

    def __init__(
        self,
        *,
        kl_max: float = 1.0,
        kl_spike_factor: float = 10.0,
        kl_spike_floor: float = 0.02,
        kl_history: int = 50,
        entropy_collapse_frac: float = 0.1,
        entropy_floor: float = 0.01,
        trend_window: int = 20,
        trend_tau: float = 0.6,
        clipfrac_max: float = 0.8,
        all_equal_max: float = 0.9,
        length_clip_max: float = 0.9,
        patience: int = 5,
        min_history: int = 5,
    ):
        if trend_window < 4:
            raise ValueError(f"trend_window={trend_window} < 4: too short for a trend test")
        self.kl_max = kl_max
        self.kl_spike_factor = kl_spike_factor
        self.kl_spike_floor = kl_spike_floor
        self.entropy_collapse_frac = entropy_collapse_frac
        self.entropy_floor = entropy_floor
        self.trend_window = trend_window
        self.trend_tau = trend_tau
        self.clipfrac_max = clipfrac_max
        self.all_equal_max = all_equal_max
        self.length_clip_max = length_clip_max
        self.patience = patience
        self.min_history = min_history
        self.fired: set[str] = set()
        self._kl = {k: collections.deque(maxlen=kl_history) for k in KL_KEYS}
        self._entropy_early: list[float] = []
        self._pg = collections.deque(maxlen=trend_window)
        self._streak: collections.Counter[str] = collections.Counter()
        self._pairs = np.triu_indices(trend_window, k=1)

    def check(self, step: int, metrics: dict[str, Any]) -> list[str]:
        """Warnings raised by this step's metrics (each kind, and non-finite values of each
        metric family, once per run); also logged.

        `metrics` maps verl metric names to numbers (floats, numpy or JAX scalars, or the
        strings "nan"/"inf" that `metrics.jsonl` holds); absent metrics are not checked.
        """
        values = {
            k: f for k, v in metrics.items() if k != "step" and (f := _as_float(v)) is not None
        }
        found: list[tuple[str, str]] = []
        bad = {
            k: v for k, v in values.items() if not math.isfinite(v) and not _nothing_scored(k, v)
        }
        by_family: dict[str, dict[str, float]] = {}
        for k, v in bad.items():
            by_family.setdefault(k.split("/")[0], {})[k] = v
        for family, keys in sorted(by_family.items()):
            found.append((f"non_finite:{family}", self._non_finite(step, family, keys)))
        finite = {k: v for k, v in values.items() if math.isfinite(v)}
        for kind, msg in (
            self._kl_check(step, finite),
            self._entropy_check(step, finite),
            self._trend_check(step, finite),
            self._level_check(
                step, finite, "clipfrac_high", "actor/pg_clipfrac", self.clipfrac_max,
                "most tokens hit the PPO clip, so the update is far off-policy; lower "
                "OptimConfig.lr, use fewer AlgoConfig.ppo_epochs or mini_batches, or check "
                "the rollout/trainer logprob gap (rollout/logprob_diff/mean)",
            ),
            self._all_equal_check(step, finite),
            self._level_check(
                step, finite, "length_at_cap", "response_length/clip_ratio",
                self.length_clip_max,
                "responses are truncated at the length cap; raise "
                "RolloutConfig.max_new_tokens, set AlgoConfig.overlong_filter=True to drop "
                "truncated responses from the loss, or check that EOS/stop strings are "
                "produced (a repetition loop shows in samples)",
            ),
        ):  # fmt: skip
            if kind is not None:
                found.append((kind, msg))
        out = []
        for kind, msg in found:
            if kind in self.fired:
                continue
            self.fired.add(kind)
            log.warning("%s", msg)
            out.append(msg)
        return out

    # -- checks: each returns (kind, message) or (None, "") --------------------------------

    def _non_finite(self, step: int, family: str, bad: dict[str, float]) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(bad.items())[:6])
        more = f" (+{len(bad) - 6} more)" if len(bad) > 6 else ""
        head = f"step {step}: non-finite metrics: {shown}{more}."
        if family not in UPDATE_FAMILIES:
            return (
                f"{head} Not a loss or gradient, so no update was skipped for it; check what "
                "computes it (e.g. a reward function returning inf, a tool's counter)"
            )
        return (
            f"{head} The trainer skips any update whose loss or gradient is non-finite "
            f"(parameters unchanged; {family}/skipped > 0 says it did); if it repeats, lower "
            "OptimConfig.lr, keep OptimConfig.max_grad_norm on, train in float32, and check "
            "rewards and advantages for inf/NaN (e.g. a reward function returning inf)"
        )

    def _kl_check(self, step: int, m: dict[str, float]) -> tuple[str | None, str]:
        hit = None
        for key in KL_KEYS:
            if key not in m:
                continue
            v, hist = abs(m[key]), self._kl[key]
            median = float(np.median(hist)) if len(hist) >= self.min_history else None
            if hit is None and "kl_explosion" not in self.fired:
                if v > self.kl_max:
                    hit = f"{key}={m[key]:.4g} > {self.kl_max:g}"
                elif (
                    median is not None
                    and v > self.kl_spike_floor
                    and v > self.kl_spike_factor * median
                ):
                    hit = (
                        f"{key}={m[key]:.4g} is {v / max(median, 1e-12):.0f}x its running "
                        f"median {median:.3g}"
                    )
            hist.append(v)
        if hit is None:
            return None, ""
        return "kl_explosion", (
            f"step {step}: KL exploding: {hit}. The policy is moving too far per step; lower "
            "OptimConfig.lr, raise AlgoConfig.kl_loss_coef (with use_kl_loss=True), tighten "
            "AlgoConfig.clip_low/clip_high, or use fewer ppo_epochs"
        )

    def _entropy_check(self, step: int, m: dict[str, float]) -> tuple[str | None, str]:
        v = m.get("actor/entropy")
        if v is None:
            return None, ""
        early = self._entropy_early
        if len(early) < self.min_history:
            early.append(v)
        ref = float(np.mean(early)) if len(early) >= self.min_history else None
        low = v < self.entropy_floor or (ref is not None and v < self.entropy_collapse_frac * ref)
        if not self._streak_holds("entropy_collapse", low):
            return None, ""
        ref_s = f"{ref:.4g}" if ref is not None else "n/a"
        return "entropy_collapse", (
            f"step {step}: entropy collapsing: actor/entropy={v:.4g} (early value {ref_s}, "
            f"below {self.entropy_collapse_frac:g}x or {self.entropy_floor:g} for "
            f"{self.patience} steps). The policy is turning deterministic and will stop "
            "exploring; raise RolloutConfig.temperature, use a larger AlgoConfig.clip_high "
            "(DAPO clip-higher), add AlgoConfig.entropy_coef, or lower OptimConfig.lr"
        )

    def _trend_check(self, step: int, m: dict[str, float]) -> tuple[str | None, str]:
        v = m.get("actor/pg_loss")
        if v is None:
            return None, ""
        self._pg.append(v)
        if len(self._pg) < self.trend_window or "pg_loss_trend" in self.fired:
            return None, ""
        y = np.fromiter(self._pg, dtype=np.float64, count=self.trend_window)
        i, j = self._pairs
        dy = y[j] - y[i]
        tau = float(np.sign(dy).mean())
        slope = float(np.median(dy / (j - i)))
        recent = float(np.median(y[-max(self.trend_window // 4, 1) :]))
        if tau <= self.trend_tau or slope <= 0 or recent <= 0:
            return None, ""
        return "pg_loss_trend", (
            f"step {step}: actor/pg_loss trending upward over the last {self.trend_window} "
            f"steps (Kendall tau {tau:.2f}, Theil-Sen slope {slope:.3g}/step, now {v:.4g}, "
            f"was {y[0]:.4g}). With normalised advantages it should hover near 0; check the "
            "advantage signs and reward, and try a lower OptimConfig.lr"
        )

    def _level_check(
        self, step: int, m: dict[str, float], kind: str, key: str, limit: float, hint: str
    ) -> tuple[str | None, str]:
        v = m.get(key)
        if v is None or not self._streak_holds(kind, v > limit):
            return None, ""
        return kind, f"step {step}: {key}={v:.3g} > {limit:g} for {self.patience} steps: {hint}"

    def _all_equal_check(self, step: int, m: dict[str, float]) -> tuple[str | None, str]:
        key = "batch/all_equal_groups_frac"
        v = m.get(key)
        if v is None or not self._streak_holds("all_equal_groups", v > self.all_equal_max):
            return None, ""
        score = m.get("critic/score/mean")
        score_s = "" if score is None else f", critic/score/mean={score:.3g}"
        return "all_equal_groups", (
            f"step {step}: {key}={v:.3g}{score_s} for {self.patience} steps: most prompt "
            "groups have all-equal rewards, so their advantages are 0 and there is no "
            "learning signal. If most answers are right (high score), use harder prompts; if "
            "most are wrong, easier ones (or a LIMR subset); or raise RolloutConfig.n, or set "
            "AlgoConfig.dynamic_sampling=True to refill such groups"
        )

    def _streak_holds(self, kind: str, cond: bool) -> bool:
        """Count consecutive steps where `cond` holds; True once the streak reaches patience."""
        self._streak[kind] = self._streak[kind] + 1 if cond else 0
        return self._streak[kind] >= self.patience and kind not in self.fired

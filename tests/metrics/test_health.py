"""`HealthMonitor`: each check fires on a trajectory showing its sign, once, and stays silent
on a healthy run."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from jaxrl_llm.metrics import read_metrics
from jaxrl_llm.metrics.health import HealthMonitor

STEPS = 120


def healthy(step: int, rng: np.random.Generator) -> dict[str, float]:
    """A GRPO step that reads as healthy: noisy pg_loss around 0, KL growing slowly, entropy
    declining gently, a few clipped tokens, a minority of all-equal groups."""
    t = step / STEPS
    return {
        "critic/score/mean": 0.3 + 0.4 * t + rng.normal(0, 0.03),
        "actor/pg_loss": rng.normal(0, 0.01),
        "actor/kl_loss": 0.002 * step + abs(rng.normal(0, 0.002)),
        "actor/ppo_kl": rng.normal(0, 2e-4),
        "actor/entropy": 1.2 - 0.4 * t + rng.normal(0, 0.02),
        "actor/pg_clipfrac": abs(rng.normal(0.03, 0.01)),
        "batch/all_equal_groups_frac": float(rng.uniform(0.1, 0.5)),
        "response_length/clip_ratio": float(rng.uniform(0.0, 0.05)),
        "response_length/mean": 60 + rng.normal(0, 2),
        "timing/step": 2.0,
    }


def run(monitor: HealthMonitor, sign=None, seed: int = 0, steps: int = STEPS) -> list[list[str]]:
    """Warnings per step; `sign(step, metrics)` alters a healthy step's metrics in place."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(1, steps + 1):
        m = healthy(step, rng)
        if sign is not None:
            sign(step, m)
        out.append(monitor.check(step, m))
    return out


def fired(per_step: list[list[str]]) -> list[tuple[int, str]]:
    return [(step, w) for step, ws in enumerate(per_step, start=1) for w in ws]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_run_is_silent(seed):
    monitor = HealthMonitor()
    assert fired(run(monitor, seed=seed)) == []
    assert monitor.fired == set()


def test_nan_fires_at_once_says_skipped_and_only_once(caplog):
    def sign(step, m):
        if step >= 30:
            m["actor/pg_loss"] = float("nan")
        if step == 40:
            m["actor/grad_norm"] = "inf"  # as metrics.jsonl stores it

    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.metrics.health"):
        warnings = fired(run(HealthMonitor(), sign))
    assert len(warnings) == 1
    step, msg = warnings[0]
    assert step == 30 and "actor/pg_loss=nan" in msg and "skip" in msg and "lr" in msg
    assert [r.getMessage() for r in caplog.records] == [msg]


def test_nan_reward_mean_is_nothing_scored_and_a_later_nan_loss_still_warns():
    """reward/<name>/mean is NaN when no sample was scored (docs/rewards.md): not a
    divergence, no warning; a NaN loss and inf grad norm later are still reported."""
    monitor = HealthMonitor()
    first = monitor.check(3, {"reward/math/mean": float("nan"), "reward/timeouts": 16,
                              "actor/pg_loss": 0.01})  # fmt: skip
    later = monitor.check(9, {"actor/pg_loss": float("nan"), "actor/grad_norm": "inf"})
    assert first == []
    (msg,) = later
    assert "actor/grad_norm=inf" in msg and "actor/pg_loss=nan" in msg and "skip" in msg


def test_non_finite_warns_once_per_key_family():
    """An inf timing (or a reward's inf mean) is reported without the claim that an update
    was skipped, and does not silence a NaN loss later; each family warns once."""

    def sign(step, m):
        if step >= 20:
            m["timing/step"] = float("inf")
        if step == 25:
            m["reward/math/mean"] = float("inf")  # a reward returning inf is not "nothing scored"
        if step >= 30:
            m["actor/pg_loss"] = float("nan")

    warnings = fired(run(HealthMonitor(), sign))
    assert [(step, msg.split(":")[1].strip()) for step, msg in warnings] == [
        (20, "non-finite metrics"), (25, "non-finite metrics"), (30, "non-finite metrics"),
    ]  # fmt: skip
    (timing, reward, loss) = (msg for _, msg in warnings)
    assert "timing/step=inf" in timing and "skips any update" not in timing
    assert "reward/math/mean=inf" in reward and "skips any update" not in reward
    assert "actor/pg_loss=nan" in loss and "skips any update" in loss


def test_kl_above_absolute_threshold_fires():
    def sign(step, m):
        if step >= 50:
            m["actor/kl_loss"] = 2.5

    ((step, msg),) = fired(run(HealthMonitor(), sign))
    assert step == 50 and "KL exploding" in msg and "actor/kl_loss=2.5" in msg
    assert "kl_loss_coef" in msg


def test_ppo_kl_spike_over_running_median_fires():
    def sign(step, m):
        m["actor/ppo_kl"] = 1e-3 if step < 60 else 0.05  # 50x its median, under kl_max

    ((step, msg),) = fired(run(HealthMonitor(), sign))
    assert step == 60 and "actor/ppo_kl=0.05" in msg and "50x" in msg


def test_entropy_collapse_fires_after_patience():
    def sign(step, m):
        if step > 40:
            m["actor/entropy"] = 0.05  # under 0.1 x the early ~1.2

    ((step, msg),) = fired(run(HealthMonitor(patience=5), sign))
    assert step == 45 and "entropy collapsing" in msg and "actor/entropy=0.05" in msg
    assert "temperature" in msg


def test_pg_loss_upward_trend_fires():
    def sign(step, m):
        if step > 50:
            m["actor/pg_loss"] += 0.004 * (step - 50)

    warnings = fired(run(HealthMonitor(), sign))
    assert [w for _, w in warnings if "trending upward" in w] == [w for _, w in warnings]
    ((step, msg),) = warnings
    assert 55 < step < 80 and "Kendall tau" in msg


def test_one_outlier_is_not_a_trend():
    def sign(step, m):
        if step == 100:
            m["actor/pg_loss"] = 5.0

    assert fired(run(HealthMonitor(), sign)) == []


def test_clip_fraction_near_one_fires_after_patience_not_on_one_step():
    def blip(step, m):
        if step in (20, 21, 40):
            m["actor/pg_clipfrac"] = 0.97

    assert fired(run(HealthMonitor(patience=3), blip)) == []

    def stuck(step, m):
        if step >= 70:
            m["actor/pg_clipfrac"] = 0.97

    ((step, msg),) = fired(run(HealthMonitor(patience=3), stuck))
    assert step == 72 and "actor/pg_clipfrac=0.97" in msg and "off-policy" in msg


def test_all_equal_groups_fires_with_no_learning_signal_hint():
    def sign(step, m):
        if step >= 10:
            m["batch/all_equal_groups_frac"] = 0.95
            m["critic/score/mean"] = 0.02

    ((step, msg),) = fired(run(HealthMonitor(), sign))
    assert step == 14
    assert "no learning signal" in msg and "easier" in msg and "harder" in msg
    assert "batch/all_equal_groups_frac=0.95" in msg and "critic/score/mean=0.02" in msg


def test_response_length_stuck_at_cap_fires():
    def sign(step, m):
        if step >= 90:
            m["response_length/clip_ratio"] = 0.99

    ((step, msg),) = fired(run(HealthMonitor(), sign))
    assert step == 94 and "response_length/clip_ratio=0.99" in msg
    assert "max_new_tokens" in msg


def test_each_kind_fires_once_per_run():
    def everything(step, m):
        m["actor/kl_loss"] = 3.0
        m["actor/pg_clipfrac"] = 0.99
        m["batch/all_equal_groups_frac"] = 1.0
        m["response_length/clip_ratio"] = 1.0
        m["actor/entropy"] = 0.0
        m["actor/pg_loss"] = 0.01 * step
        m["timing/step"] = float("inf")

    monitor = HealthMonitor()
    warnings = fired(run(monitor, everything))
    assert len(warnings) == 7 == len(monitor.fired)
    assert monitor.fired == {
        "non_finite:timing", "kl_explosion", "entropy_collapse", "pg_loss_trend", "clipfrac_high",
        "all_equal_groups", "length_at_cap",
    }  # fmt: skip


def test_reads_records_from_metrics_jsonl(grpo_run):
    monitor = HealthMonitor()
    out = {r["step"]: monitor.check(r["step"], r) for r in read_metrics(grpo_run)}
    (msg,) = out[5]  # the record whose pg_loss was written as "nan"
    assert "actor/pg_loss=nan" in msg
    assert all(not ws for s, ws in out.items() if s != 5)


def test_check_is_cheap():
    monitor = HealthMonitor()
    rng = np.random.default_rng(0)
    records = [healthy(s, rng) for s in range(1, 1001)]
    t0 = time.perf_counter()
    for step, m in enumerate(records, start=1):
        monitor.check(step, m)
    assert (time.perf_counter() - t0) / len(records) < 2e-3  # seconds per step, loose


def test_pg_loss_rising_towards_zero_from_below_is_not_a_warning():
    def sign(step, m):
        m["actor/pg_loss"] = -0.3 + 0.0029 * min(step, 100)  # -0.3 -> about -0.01

    assert fired(run(HealthMonitor(), sign)) == []

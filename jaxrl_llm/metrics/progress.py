"""Progress bars for rollout and update (OpenRLHF-style), quiet when not on a terminal."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def interactive() -> bool:
    return sys.stderr.isatty()


def bar(desc: str, total: int, *, unit: str = "it") -> tqdm:
    """A tqdm bar that disables itself when stderr is not a terminal (logs, CI)."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=not interactive(),
                dynamic_ncols=True)  # fmt: skip


def summary_line(step: int, m: dict[str, float]) -> str:
    """One log line of the metrics a reader watches, verl's names shortened."""
    keys = [
        ("score", "critic/score/mean"),
        ("val", "val/test_score"),
        ("len", "response_length/mean"),
        ("pg", "actor/pg_loss"),
        ("kl", "actor/kl_loss"),
        ("ent", "actor/entropy"),
        ("clip", "actor/pg_clipfrac"),
        ("t", "timing/step"),
        ("tok/s", "perf/tokens_per_s"),
    ]
    parts = [f"{name}={m[k]:.3g}" for name, k in keys if k in m]
    return f"step {step}: " + " ".join(parts)

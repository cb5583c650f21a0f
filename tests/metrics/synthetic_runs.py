"""Synthetic run directories with known metric values (shared by the metrics tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

STEPS = 30
EVAL_EVERY = 10


def grpo_record(step: int, *, offset: float = 0.0) -> dict:
    """A GRPO step's metrics (no critic, no tools); closed-form values so tests can check them."""
    t = step / STEPS
    rec = {
        "step": step,
        "critic/score/mean": 0.2 + 0.5 * t + offset,
        "response_length/mean": 40.0 - 10 * t + 20 * t * t,
        "response_length/max": 90.0,
        "response_length/clip_ratio": 0.05,
        "actor/pg_loss": 0.01 * np.sin(step),
        "actor/kl_loss": 0.001 * step,
        "actor/ppo_kl": 1e-4,
        "actor/entropy": 1.2 - 0.3 * t,
        "actor/pg_clipfrac": 0.02,
        "actor/grad_norm": 0.5,
        "timing/rollout": 1.5,
        "timing/update": 0.7,
        "timing/step": 2.4,
        "perf/tokens_per_s": 900.0,
    }
    if step % EVAL_EVERY == 0:
        rec["val/test_score"] = 0.1 + 0.02 * step + offset
        rec["timing/validate"] = 0.9
    return rec


def write_run(run_dir: Path, records: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir

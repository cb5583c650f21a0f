"""Fixtures: a synthetic GRPO run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.metrics.synthetic_runs import STEPS, grpo_record, write_run


@pytest.fixture
def grpo_run(tmp_path) -> Path:
    records = [{"step": 0, "val/test_score": 0.1}]
    records += [grpo_record(s) for s in range(1, STEPS + 1)]
    records[5]["actor/pg_loss"] = "nan"  # as MetricsWriter writes a non-finite value
    return write_run(tmp_path / "grpo_run", records)

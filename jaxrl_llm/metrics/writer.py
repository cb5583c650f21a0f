"""Write one record per step to `metrics.jsonl` (flushed each step) and TensorBoard.

Only process 0 writes. Names follow verl (`actor/pg_loss`, `critic/score/mean`,
`response_length/mean`, `val/test_score`, `timing/*`), so dashboards carry over.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import jax

log = logging.getLogger(__name__)


def _scalar(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f


class MetricsWriter:
    def __init__(self, run_dir: str | os.PathLike, *, tensorboard: bool = True, resume_step=None):
        self.run_dir = Path(run_dir)
        self.active = jax.process_index() == 0
        self._tb = None
        if not self.active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            # Drop records past the checkpoint we resume from: they will be recomputed.
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        elif resume_step is None:
            self.path.write_text("")
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:
                log.info("tensorboardX not installed; writing metrics.jsonl only")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.active:
            return
        record: dict[str, Any] = {"step": int(step)}
        for k, v in sorted(metrics.items()):
            f = _scalar(v)
            if f is not None:
                record[k] = f if math.isfinite(f) else str(f)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, float):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self.active:
            self._file.close()
            if self._tb is not None:
                self._tb.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl (a run dir or the file); a torn last line is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out

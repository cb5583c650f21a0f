"""Write one record per step to `metrics.jsonl` (flushed each step), TensorBoard and,
optionally, Weights & Biases.

Only process 0 writes. Names follow verl (`actor/pg_loss`, `critic/score/mean`,
`response_length/mean`, `val/test_score`, `timing/*`), so dashboards carry over. A NaN or
infinite value reaches TensorBoard and W&B as that float (a diverging loss shows there);
metrics.jsonl, strict JSON, holds it as the string "nan", "inf" or "-inf".

The run directory may be a `gs://` (or `s3://`) path (`etils.epath`): object stores cannot
append, so there metrics.jsonl is rewritten whole at each step (a few KB per step), and so
are TensorBoard's event files (`metrics/tensorboard.py`).

On `--resume` from step N, metrics.jsonl keeps the records of steps <= N, and TensorBoard
shows the steps after N from the resumed run only (a purge at N + 1:
`tensorboard.summary_writer`); a fresh start in a folder with earlier events hides them all.

W&B is used only when `MetricsConfig.wandb_project` is set and `wandb` imports (it is not a
dependency: `pip install wandb`, then `wandb login` or WANDB_API_KEY). The W&B run id is
kept in the run directory (`wandb_run_id`), so `--resume` continues the same W&B run. W&B's
history only grows: steps after N that the W&B run already holds keep the first attempt's
values, and W&B ignores (with a warning) the resumed run's logs for them, up to the last
step it had; the run's own `metrics.jsonl` and TensorBoard hold the resumed values.
(W&B's `resume_from="ID?_step=N"` rewind would truncate it, but is a private preview.)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import uuid
from typing import Any

import gin
import jax
from etils import epath

from jaxrl_llm.config_checks import ConfigError, checked_fields, documented
from jaxrl_llm.metrics.tensorboard import summary_writer

log = logging.getLogger(__name__)


def _scalar(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields()
class MetricsConfig:
    """Where metrics go besides metrics.jsonl: `MetricsConfig.wandb_project = "my-rl"`."""

    tensorboard: bool = documented(True, "Also write TensorBoard event files to the run directory.")
    wandb_project: str | None = documented(
        None, "Weights & Biases project to log to (needs `pip install wandb`); None: no W&B."
    )
    wandb_entity: str | None = documented(
        None, "W&B entity (user or team); None: W&B's default entity for the API key."
    )
    wandb_name: str | None = documented(None, "W&B run name; None: the run directory's name.")


class MetricsWriter:
    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        tensorboard: bool | None = None,
        resume_step=None,
        config: MetricsConfig | None = None,
    ):
        """`config` None reads the gin bindings of `MetricsConfig`; `tensorboard` overrides
        the config's."""
        config = config or MetricsConfig()
        if tensorboard is not None:
            config = dataclasses.replace(config, tensorboard=tensorboard)
        self.run_dir = epath.Path(run_dir)
        self.active = jax.process_index() == 0
        self._tb = None
        self._wandb = None
        if not self.active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._lines: list[str] = []
        if resume_step is not None and self.path.exists():
            # Drop records past the checkpoint we resume from: they will be recomputed.
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            self._lines = [json.dumps(r) + "\n" for r in kept]
        self.path.write_text("".join(self._lines))
        self._remote = "://" in os.fspath(self.path)
        self._file = None if self._remote else self.path.open("a", encoding="utf-8")
        if config.tensorboard:
            # TensorBoard drops what earlier sessions logged from the first step this one
            # writes, as metrics.jsonl is trimmed (emptied on a fresh start).
            purge = 0 if resume_step is None else resume_step + 1
            self._tb = summary_writer(self.run_dir, purge_step=purge)
        if config.wandb_project:
            self._wandb = _start_wandb(config, self.run_dir, resuming=resume_step is not None)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.active:
            return
        values = {k: f for k in sorted(metrics) if (f := _scalar(metrics[k])) is not None}
        # Strict JSON has no NaN or inf: metrics.jsonl holds them as "nan" / "inf" strings;
        # TensorBoard and W&B get the float, so a diverging run shows there too.
        record = {"step": int(step)} | {
            k: f if math.isfinite(f) else str(f) for k, f in values.items()
        }
        line = json.dumps(record) + "\n"
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
        else:
            self._lines.append(line)
            self.path.write_text("".join(self._lines))
        if self._tb is not None:
            for k, f in values.items():
                self._tb.add_scalar(k, f, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=int(step))

    def close(self) -> None:
        if self.active:
            if self._file is not None:
                self._file.close()
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.finish()


def _start_wandb(config: MetricsConfig, run_dir: epath.Path, *, resuming: bool) -> Any:
    """A W&B run (the object `wandb.init` returns), or None when wandb is not installed."""
    try:
        import wandb
    except ImportError:
        log.warning(
            "MetricsConfig.wandb_project = %r but wandb is not installed (pip install wandb); "
            "writing metrics.jsonl and TensorBoard only",
            config.wandb_project,
        )
        return None
    id_file = run_dir / "wandb_run_id"
    run_id = id_file.read_text().strip() if resuming and id_file.exists() else uuid.uuid4().hex
    id_file.write_text(run_id)
    return wandb.init(
        project=config.wandb_project,
        entity=config.wandb_entity,
        name=config.wandb_name or run_dir.name,
        id=run_id,
        resume="allow",
        dir=None if "://" in os.fspath(run_dir) else str(run_dir),  # W&B's files: local
        config={"gin": gin.operative_config_str()},
    )


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl (a run dir or the file); a torn last line is skipped, and
    a line that is JSON but not an object (a hand edit: `null`, `[1]`) with a warning that
    names it, so `--resume`'s writer and `plot` read records only."""
    path = epath.Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    out, skipped = [], []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {e.start}): give a run's metrics.jsonl"
        ) from None
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
        else:
            skipped.append(number)
    if skipped:
        log.warning("%s: skipped line(s) %s: not JSON objects", path, skipped[:10])
    return out

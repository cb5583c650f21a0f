"""Per-sample records of a run (LIMR reads them to score prompts)."""

from __future__ import annotations

import os

import jax

from jaxrl_llm.data import limr
from jaxrl_llm.types import Rollout


def record_step_samples(run_dir: str | os.PathLike, step: int, rollout: Rollout) -> None:
    """LIMR's per-sample record: samples/step_N.jsonl with prompt id and reward; N (`step`)
    is the batch's position in the data order plus one, the training step unless dynamic
    sampling draws more batches than steps (`rl_loop._collect`)."""
    if jax.process_index() != 0:  # every host holds the whole (gathered) batch
        return
    ids = [p for p in rollout.prompt_ids for _ in range(rollout.group_size)]
    limr.record_samples(run_dir, step, ids, rollout.scores)

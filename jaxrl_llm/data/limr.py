"""LIMR: Learning Impact Measurement, scoring and selecting RL prompts by their learning curves.

LIMR (Li, Zou and Liu 2025, "LIMR: Less is More for RL Scaling", arXiv:2502.11886; code at
GAIR-NLP/LIMR, ``lim/lim_selection.py``) trains once on the full prompt set, records every
sample's reward, and keeps the prompts whose per-epoch accuracy curve follows the average
curve: those are the ones the model learned from.

The workflow, as plain functions (the ``jaxrl-llm limr score|select`` CLI calls them):

1. during training, ``record_samples(run_dir, step, prompt_ids, rewards)`` writes
   ``run_dir/samples/step_<step>.jsonl`` (one line per sample: step, prompt id, reward). The RL
   loop records every batch it draws from the data, as sampled, under its position in the
   data order (``PromptBatch.index + 1``): record i is batch i of the data, so epoch e (from
   0) is records ``e * steps_per_epoch + 1 .. (e + 1) * steps_per_epoch``, which hold each of
   the epoch's prompts once. Without dynamic sampling record i is RL step i's batch; with it
   (DAPO) a step may draw several batches, and every one is recorded, the all-equal groups
   it drops included;
2. ``score_run(run_dir, steps_per_epoch, epochs)`` turns those files into per-epoch accuracies
   and LIM scores, written to ``run_dir/lim_scores.json``; it refuses (``ConfigError``) records
   that end before the last epoch asked for, and a result with no prompt left;
3. ``select(scores, data_path, threshold, out_path)`` (``jaxrl_llm.data.limr_select``) writes the
   prompts with score >= threshold in the training data's own format; ``random_subset(data_path,
   n, seed, out_path)`` writes the RAND baseline of the same size; neither writes an empty
   subset (``ConfigError`` saying why it would be empty);
4. ``plot_lim_curves`` (``jaxrl_llm.data.limr_plot``) draws the mean curve with a few selected
   and rejected prompts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from etils import epath

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.rewards.config import solved

log = logging.getLogger(__name__)

SAMPLES_DIR = "samples"
SCORES_FILE = "lim_scores.json"
_STEP_FILE = re.compile(r"^step_(\d+)(?:\.p(\d+))?\.jsonl$")


def lim_scores(accuracy: np.ndarray) -> np.ndarray:
    """LIM score of each prompt: how closely its accuracy curve follows the mean curve.

    s_i = 1 - sum_k (r_ik - rbar_k)^2 / sum_k (1 - rbar_k)^2, with rbar_k = mean_i r_ik
    (LIMR, eq. 2-3). A prompt on the mean curve scores 1; the denominator is the distance of
    the mean curve from perfect accuracy, so scores can be negative for far-off curves.

    Degenerate case: when every prompt is solved in every epoch, rbar_k = 1 for all k and the
    ratio is 0/0 (every curve equals the mean curve); all scores are then defined as 1.0 and a
    warning is logged. (LIMR's script would divide by zero there.)

    Args:
      accuracy: float ``[prompts, epochs]`` array of accuracies in [0, 1], no NaN.

    Returns:
      float64 ``[prompts]`` scores.
    """
    r = np.asarray(accuracy, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"accuracy must be [prompts, epochs], got shape {r.shape}")
    if r.shape[0] == 0:
        return np.zeros((0,), dtype=np.float64)
    if r.shape[1] == 0 or not np.all(np.isfinite(r)) or r.min() < 0 or r.max() > 1:
        raise ValueError("accuracy needs at least one epoch and finite values in [0, 1]")
    mean_curve = r.mean(axis=0)
    denominator = np.sum((1.0 - mean_curve) ** 2)
    if denominator == 0.0:
        log.warning("every prompt is solved in every epoch: LIM scores are all defined as 1")
        return np.ones(r.shape[0], dtype=np.float64)
    return 1.0 - np.sum((r - mean_curve) ** 2, axis=1) / denominator


def record_samples(
    run_dir: str | os.PathLike,
    step: int,
    prompt_ids: Sequence[str],
    rewards: Sequence[float] | np.ndarray,
    *,
    process_index: int = 0,
) -> epath.Path:
    """Writes one RL step's sample rewards to ``run_dir/samples/step_<step>.jsonl``, atomically.

    Call once per batch drawn from the data with every sample of the batch (G per prompt:
    repeat the prompt's id), the dropped ones of dynamic sampling included.
    The file appears complete or not at all (written to a temporary file, then renamed), so a
    run killed mid-write leaves no half file. Re-recording a step (after a resume) replaces it.

    Args:
      run_dir: the run directory.
      step: the record's number: the batch's 1-based position in the data order (the batch
        with ``PromptBatch.index == i`` is ``i + 1``); the RL step when every step draws one
        batch, which dynamic sampling does not.
      prompt_ids: ``[samples]`` the id of each sample's prompt.
      rewards: ``[samples]`` each sample's scalar reward.
      process_index: on multi-host runs where each host records its own samples, pass
        ``jax.process_index()``; hosts other than 0 write ``step_<step>.p<index>.jsonl``.

    Returns:
      the path written.
    """
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if len(prompt_ids) != len(rewards):
        raise ValueError(f"{len(prompt_ids)} prompt ids but {len(rewards)} rewards")
    folder = epath.Path(run_dir) / SAMPLES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    suffix = f".p{process_index}" if process_index else ""
    path = folder / f"step_{int(step)}{suffix}.jsonl"
    lines = [
        json.dumps({"step": int(step), "prompt_id": str(pid), "reward": float(r)})
        for pid, r in zip(prompt_ids, rewards, strict=True)
    ]
    write_atomic(path, "".join(line + "\n" for line in lines))
    return path


def write_atomic(path: epath.Path, text: str) -> None:
    """A local file through a renamed temporary; an object (gs://) is whole once written."""
    if "://" in os.fspath(path):
        path.write_text(text, encoding="utf-8")
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclasses.dataclass
class LimScores:
    """The result of scoring a run.

    Attributes:
      ids: prompt ids, sorted, one per row of ``accuracy``.
      accuracy: float ``[prompts, epochs]`` per-epoch accuracy after back-filling.
      scores: float ``[prompts]`` LIM scores.
      mean_curve: float ``[epochs]`` mean accuracy curve over the kept prompts.
      dropped: ids left out because an epoch was still missing after back-filling.
      backfilled: number of (prompt, epoch) cells filled from the next epoch.
      steps_per_epoch, epochs, correct_reward: the settings used.
    """

    ids: list[str]
    accuracy: np.ndarray
    scores: np.ndarray
    mean_curve: np.ndarray
    dropped: list[str]
    backfilled: int
    steps_per_epoch: int
    epochs: int
    correct_reward: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.epochs,
            "correct_reward": self.correct_reward,
            "mean_curve": self.mean_curve.tolist(),
            "backfilled": self.backfilled,
            "dropped": self.dropped,
            "prompts": [
                {"id": pid, "score": float(s), "accuracy": acc.tolist()}
                for pid, s, acc in zip(self.ids, self.scores, self.accuracy, strict=True)
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LimScores:
        prompts = d["prompts"]
        epochs = int(d["epochs"])
        return cls(
            ids=[p["id"] for p in prompts],
            accuracy=np.asarray([p["accuracy"] for p in prompts], dtype=np.float64).reshape(
                len(prompts), epochs
            ),
            scores=np.asarray([p["score"] for p in prompts], dtype=np.float64),
            mean_curve=np.asarray(d["mean_curve"], dtype=np.float64),
            dropped=list(d["dropped"]),
            backfilled=int(d["backfilled"]),
            steps_per_epoch=int(d["steps_per_epoch"]),
            epochs=epochs,
            correct_reward=float(d["correct_reward"]),
        )

    def save(self, path: str | os.PathLike) -> epath.Path:
        path = epath.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.as_dict()) + "\n")
        return path


def load_scores(path: str | os.PathLike) -> LimScores:
    """Reads a scores file written by ``score_run``; ``ConfigError`` when there is none."""
    path = epath.Path(path)
    if not path.is_file():
        raise ConfigError(
            f"LIM scores file '{path}': no such file; write it with `jaxrl-llm limr score`"
        )
    try:
        return LimScores.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"'{path}' is not a LIM scores file (as `jaxrl-llm limr score` writes): "
            f"{type(e).__name__}: {e}"
        ) from e


def backfill_and_drop(accuracy: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """LIMR's rules for prompts missing from some epochs (NaN cells in ``accuracy``).

    A missing epoch k takes epoch k+1's value when epoch k+1 was itself observed (one step
    only, as in LIMR's ``process_accuracy_sequences``: a gap of two epochs is not bridged, and
    a missing last epoch cannot be filled). Prompts still missing an epoch are dropped.

    Args:
      accuracy: float ``[prompts, epochs]`` with NaN for epochs without samples.

    Returns:
      (filled accuracy, boolean ``[prompts]`` mask of complete prompts, cells filled).
    """
    observed = ~np.isnan(accuracy)
    filled = accuracy.copy()
    fill = ~observed[:, :-1] & observed[:, 1:]
    filled[:, :-1][fill] = accuracy[:, 1:][fill]
    complete = ~np.isnan(filled).any(axis=1)
    return filled, complete, int(fill.sum())


def _sample_files(run_dir: epath.Path, first_step: int) -> list[tuple[int, epath.Path]]:
    """Every ``samples/step_<N>[.p<host>].jsonl`` with N >= ``first_step``, as (N, path)."""
    if not run_dir.is_dir():
        raise ConfigError(
            f"run directory '{run_dir}': no such folder; expected the directory of a "
            f"`jaxrl-llm train` run (it holds {SAMPLES_DIR}/)"
        )
    if not (run_dir / SAMPLES_DIR).is_dir():
        raise ConfigError(
            f"run directory '{run_dir}': no {SAMPLES_DIR}/ folder in it; expected the directory "
            f"of a `jaxrl-llm train` run, which records {SAMPLES_DIR}/step_N.jsonl as it samples"
        )
    files = []
    for path in sorted((run_dir / SAMPLES_DIR).glob("step_*.jsonl")):
        match = _STEP_FILE.match(path.name)
        if match and int(match.group(1)) >= first_step:
            files.append((int(match.group(1)), path))
    if not files:
        raise ConfigError(f"no sample records from step {first_step} on in {run_dir / SAMPLES_DIR}")
    return files


def _epoch_files(
    run_dir: epath.Path, steps_per_epoch: int, epochs: int, first_step: int
) -> list[tuple[int, epath.Path]]:
    """The sample files of the ``epochs`` epochs asked for; ``ConfigError`` when the records
    end before the last of them does (its prompts could not be scored: LIMR drops a prompt
    whose last epoch is missing)."""
    files = _sample_files(run_dir, first_step)
    last_step = first_step + steps_per_epoch * epochs - 1
    last_recorded = max(step for step, _ in files)
    if last_recorded < last_step:
        whole = (last_recorded - first_step + 1) // steps_per_epoch
        scorable = (
            f"{whole} whole epoch{'s' if whole > 1 else ''} can be scored (--epochs {whole})"
            if whole
            else f"no whole epoch of {steps_per_epoch} steps was recorded"
        )
        raise ConfigError(
            f"the sample records in {run_dir / SAMPLES_DIR} end at step_{last_recorded}.jsonl, "
            f"before the last of the {epochs} epochs asked for ends (step {last_step}: "
            f"{steps_per_epoch} steps per epoch from step {first_step}); {scorable}, or train "
            f"on (--resume with a larger RLConfig.steps) until step_{last_step}.jsonl is written"
        )
    files = [(step, path) for step, path in files if step <= last_step]
    missing = set(range(first_step, last_step + 1)) - {step for step, _ in files}
    if missing:
        log.warning(
            "%d of %d steps have no sample file (first missing: step %d)",
            len(missing),
            last_step - first_step + 1,
            min(missing),
        )
    return files


def score_run(
    run_dir: str | os.PathLike,
    steps_per_epoch: int,
    epochs: int,
    *,
    correct_reward: float = 1.0,
    first_step: int = 1,
    out_path: str | os.PathLike | None = None,
) -> LimScores:
    """Computes every prompt's per-epoch accuracy and LIM score from a run's sample records.

    Step s belongs to epoch ``(s - first_step) // steps_per_epoch``; steps past
    ``epochs * steps_per_epoch`` are ignored. A sample is correct when it solved its problem
    by the rule validation and ``eval`` use, reward >= ``correct_reward`` compared in float32
    (``rewards.config.solved``; LIMR: reward == 1, the same where no bonus lifts a reward
    above it); a warning says when no sample is. Missing epochs are back-filled from the next
    one and prompts still incomplete are dropped (``backfill_and_drop``). Unreadable sample
    lines are skipped with a warning. Raises ``ConfigError`` (nothing written) when the records end
    before the last step of the last epoch asked for (naming the last record and how many
    whole epochs can be scored), and when no prompt is left to score.

    Args:
      run_dir: the run directory holding ``samples/``.
      steps_per_epoch: batches per pass over the data (``PromptPipeline.steps_per_epoch``:
        usable prompts // ``DataConfig.prompts_per_step``); the RL steps per epoch when each
        step draws one batch.
      epochs: how many epochs to score (LIMR: 21).
      correct_reward: a sample is correct at this reward or more (`RewardConfig.correct`).
      first_step: the number of the first step (1, as ``record_samples`` is documented).
      out_path: where to write the scores; default ``run_dir/lim_scores.json``.

    Returns:
      the ``LimScores`` (also written to ``out_path``).
    """
    run_dir = epath.Path(run_dir)
    for name, value in (("steps_per_epoch", steps_per_epoch), ("epochs", epochs)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    counts: dict[str, np.ndarray] = {}
    bad_lines = 0
    for step, path in _epoch_files(run_dir, steps_per_epoch, epochs, first_step):
        epoch = (step - first_step) // steps_per_epoch
        with path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    sample = json.loads(line)
                    pid, reward = str(sample["prompt_id"]), float(sample["reward"])
                except (ValueError, KeyError, TypeError):
                    bad_lines += 1
                    continue
                cell = counts.setdefault(pid, np.zeros((epochs, 2)))[epoch]
                cell[0] += bool(solved(reward, correct_reward))  # float32, as recorded
                cell[1] += 1
    if bad_lines:
        log.warning("skipped %d unreadable sample lines", bad_lines)
    if not counts:
        raise ConfigError(f"no readable sample records in {run_dir / SAMPLES_DIR}")
    correct, total = (sum(c[:, k].sum() for c in counts.values()) for k in (0, 1))
    if not correct:
        log.warning(
            "no sample of the %d scored has reward %g or more, the correct one: every accuracy "
            "is 0 and every prompt scores 1; pass the run's RewardConfig.correct "
            "(--correct-reward)",
            total,
            correct_reward,
        )

    all_ids = sorted(counts)
    table = np.stack([counts[pid] for pid in all_ids])  # [P, E, 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(table[..., 1] > 0, table[..., 0] / table[..., 1], np.nan)
    filled, complete, backfilled = backfill_and_drop(accuracy)
    if not complete.any():
        raise ConfigError(
            f"no prompt has samples in every one of the {epochs} epochs after back-filling "
            f"(all {len(all_ids)} dropped): check that {steps_per_epoch} steps per epoch is "
            "the run's batches per pass over its data"
        )
    kept = filled[complete]
    result = LimScores(
        ids=[pid for pid, ok in zip(all_ids, complete, strict=True) if ok],
        accuracy=kept,
        scores=lim_scores(kept),
        mean_curve=kept.mean(axis=0),
        dropped=[pid for pid, ok in zip(all_ids, complete, strict=True) if not ok],
        backfilled=backfilled,
        steps_per_epoch=steps_per_epoch,
        epochs=epochs,
        correct_reward=correct_reward,
    )
    result.save(out_path or run_dir / SCORES_FILE)
    log.info(
        "LIM scores for %d prompts (%d dropped as incomplete, %d epochs back-filled)",
        len(result.ids),
        len(result.dropped),
        backfilled,
    )
    return result

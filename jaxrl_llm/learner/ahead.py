"""Batches sampled ahead of training, saved in a checkpoint as JSON and restored whole.

An overlapped run (`RLConfig.max_staleness = k`) checkpointed at step s has sampled steps
s + 1 ... s + k with weights older than the checkpoint's (`overlap.RolloutProducer.
checkpoint`); they are saved in the checkpoint's JSON `extra` and trained first on resume, so
the resumed run equals the uninterrupted one. Every array round-trips exactly, dtype
included: integers as ints, float32 values as the decimal of their float64 value (a float32
read back from it is the same float32).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxrl_llm.models.config import CheckpointError
from jaxrl_llm.types import Completion, Rollout

if TYPE_CHECKING:
    from jaxrl_llm.learner.checkpoint import Checkpointer
    from jaxrl_llm.learner.overlap import RolloutProducer

Batch = tuple[Rollout, dict[str, float]]
_ARRAYS = ("prompt_ids", "token_ids", "logprobs", "raw_logprobs", "response_mask", "token_versions")


def save(
    ckpt: Checkpointer, step: int, state: Any, prompts: Any, saved: dict[int, Batch],
    producer: RolloutProducer | None, *, kl_coef: float | None = None,
) -> None:  # fmt: skip
    """A checkpoint after step `step`: the train `state` (`run.device_state`), the batches
    sampled ahead with older weights (`producer.checkpoint`; when synchronous, the `saved`
    ones this run has not trained yet), the data iterator's state after their prompts and,
    the adaptive KL controller's weight for the next step (`RunState.kl_coef`; None: a fixed
    weight, the config's on resume)."""
    if producer is not None:
        data, ahead = producer.checkpoint(step)
    else:
        data, ahead = prompts.get_state(), {t: b for t, b in saved.items() if t > step}
    extra = {"data": data, "step": step, "ahead": [encode(t, b) for t, b in sorted(ahead.items())]}
    if kl_coef is not None:
        extra["kl_in_reward_coef"] = kl_coef
    ckpt.save(step, state, extra)


def encode(step: int, batch: Batch) -> dict[str, Any]:
    """Step `step`'s batch as JSON values."""
    rollout, metrics = batch
    return {
        "step": step,
        "completions": [_encode_completion(c) for c in rollout.completions],
        "answers": [_plain(a) for a in rollout.answers],
        "prompt_ids": [_plain(p) for p in rollout.prompt_ids],
        "scores": rollout.scores.astype(np.float32).tolist(),
        "group_size": rollout.group_size,
        "policy_version": rollout.policy_version,
        "metrics": {k: float(v) for k, v in metrics.items()},
    }


def decode(record: dict[str, Any]) -> tuple[int, Batch]:
    """(step, batch) of an `encode` record."""
    try:
        rollout = Rollout(
            completions=tuple(_decode_completion(c) for c in record["completions"]),
            answers=tuple(record["answers"]),
            prompt_ids=tuple(record["prompt_ids"]),
            scores=np.asarray(record["scores"], np.float32),
            group_size=int(record["group_size"]),
            policy_version=int(record["policy_version"]),
        )
        return int(record["step"]), (rollout, dict(record["metrics"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"a checkpoint's saved batch is malformed ({type(e).__name__}: {e})"
        ) from e


def check_group_size(batches: dict[int, Batch], n: int, step_dir: Any) -> None:
    """Refuse batches sampled ahead with another group size than this run's `n`
    (`RolloutConfig.n`): trained with it, GRPO's baseline would average other groups'
    samples. One `CheckpointError` naming checkpoint `step_dir`, the saved n and the steps."""
    other = sorted((step, r.group_size) for step, (r, _) in batches.items() if r.group_size != n)
    if other:
        g = other[0][1]
        steps = [step for step, size in other if size == g]
        raise CheckpointError(
            f"checkpoint {step_dir} holds the batches of steps {steps}, sampled ahead with "
            f"RolloutConfig.n = {g} (this run: {n}); resume with RolloutConfig.n = {g}, or "
            "start a new run_dir"
        )


def _encode_completion(c: Completion) -> dict[str, Any]:
    out = dataclasses.asdict(c)
    arrays = {name: out[name] for name in _ARRAYS if out[name] is not None}
    out.update({name: np.asarray(a).tolist() for name, a in arrays.items()})
    out["dtypes"] = {name: str(np.asarray(a).dtype) for name, a in arrays.items()}
    out["turn_rewards"] = [float(r) for r in c.turn_rewards]
    return out


def _decode_completion(d: dict[str, Any]) -> Completion:
    d = dict(d)
    for name, dtype in d.pop("dtypes").items():
        d[name] = np.asarray(d[name], np.dtype(dtype))
    d["turn_rewards"] = tuple(d["turn_rewards"])
    return Completion(**d)


def _plain(x: Any) -> Any:
    """A data row's value as JSON has it (numpy scalars and arrays from parquet included)."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x

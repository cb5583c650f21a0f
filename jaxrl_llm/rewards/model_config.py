"""`RewardModelConfig` and the "rm:/path" reward names: what configs say about reward models,
kept apart from `rewards.model` so that reading a config never imports JAX."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import gin

from jaxrl_llm.config_checks import ConfigError, Ge, checked_fields, documented
from jaxrl_llm.rewards.judge_config import is_judge_reward
from jaxrl_llm.rewards.judge_config import short_name as judge_short_name

RM_PREFIX = "rm:"
NORMALIZATIONS = ("raw", "whiten", "sigmoid")
WHITEN_EPS = 1e-6


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    normalize=NORMALIZATIONS, dtype=("float32", "bfloat16"), batch_size=Ge(1), max_length=Ge(2)
)
class RewardModelConfig:
    """How an `rm:` reward model scores (docs/rewards.md, "Reward models"); a reward's own
    options in `RewardConfig.weights` override these for that model."""

    normalize: str = documented(
        "raw",
        "'raw': the model's score; 'whiten': (score - mean) / (std + 1e-6) over the rows of "
        "one scoring call; 'sigmoid': 1 / (1 + exp(-score)).",
    )
    dtype: str = documented(
        "float32", "Compute and storage dtype of the reward model ('bfloat16' on accelerators)."
    )
    batch_size: int = documented(
        16, "Packed rows (of several conversations each) per forward, rounded up to a power of two."
    )
    max_length: int = documented(
        4096, "Most tokens a row scores; a longer conversation keeps its last tokens (logged)."
    )


def is_model_reward(name: str) -> bool:
    """Whether a reward name is a reward model folder ("rm:/path")."""
    return name.startswith(RM_PREFIX)


def model_folder(name: str) -> Path:
    """The folder of an "rm:/path" reward name, with an error when the path is empty."""
    folder = name[len(RM_PREFIX) :]
    if not folder.strip():
        raise ConfigError(f"reward {name!r}: give the folder after 'rm:', e.g. 'rm:/models/rm'")
    return Path(folder)


def metric_names(names: Sequence[str]) -> dict[str, str]:
    """{reward name: its name in metric keys (`reward/<name>/mean`)}: a rule reward's own
    name; "rm:<folder basename>" for a reward model ("rm:/models/skywork/" ->
    "rm:skywork"), "judge:<folder basename>" for a judge, or its whole name when two of
    `names` share that short name."""
    short = {n: f"{RM_PREFIX}{model_folder(n).name}" for n in names if is_model_reward(n)}
    short |= {n: judge_short_name(n) for n in names if is_judge_reward(n)}
    taken = list(short.values())
    return {n: short[n] if taken.count(short.get(n)) == 1 else n for n in names}

"""`DataConfig`: where an RL run's prompts come from and how they are shaped (gin)."""

from __future__ import annotations

import dataclasses

import gin

from jaxrl_llm.config_checks import Ge, checked_fields


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    builtin_task=("arithmetic", "retrieval"),
    max_prompt_length=Ge(1),
    prompts_per_step=Ge(1),
    val_size=Ge(0),
    builtin_train_size=Ge(1),
)
class DataConfig:
    """Prompts. With no `train_file`, the built-in arithmetic task is generated."""

    train_file: str | None = None
    val_file: str | None = None
    builtin_task: str = "arithmetic"  # with no train_file: 'arithmetic' | 'retrieval'
    prompt_key: str | None = None  # None: try prompt / question / problem
    answer_key: str | None = None  # None: try answer / solution / ground_truth
    template: str = "chat"
    system_prompt: str | None = None
    max_prompt_length: int = 160
    prompts_per_step: int = 8
    val_size: int = 64
    builtin_train_size: int = 2000
    builtin_levels: tuple[int, ...] = (1, 2, 3, 4)
    seed: int = 0

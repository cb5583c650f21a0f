"""`DataConfig`: where an RL run's prompts come from and how they are shaped (gin)."""

from __future__ import annotations

import dataclasses

import gin

from jaxrl_llm.config_checks import Ge, Interval, checked_fields, documented
from jaxrl_llm.data.tasks import BUILTIN_TASKS
from jaxrl_llm.data.tasks.arithmetic import check_levels
from jaxrl_llm.data.templates import TEMPLATES


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    builtin_task=tuple(BUILTIN_TASKS),
    template=TEMPLATES,
    max_prompt_length=Ge(1),
    prompts_per_step=Ge(1),
    val_size=Ge(0),
    builtin_train_size=Ge(1),
    seed=Interval(ge=0, lt=2**32),  # Grain's shuffle seeds
)
class DataConfig:
    """Prompts. With no `train_file`, the built-in arithmetic task is generated."""

    train_file: str | None = documented(
        None, "Training prompts, a jsonl or parquet file; None: the built-in task `builtin_task`."
    )
    val_file: str | None = documented(
        None,
        "Validation prompts (jsonl or parquet), all scored at each validation; None with a "
        "`train_file`: no validation.",
    )
    builtin_task: str = documented(
        "arithmetic", "The generated task used when `train_file` is None."
    )
    prompt_key: str | None = documented(
        None, "Column holding the prompt; None: the first of prompt, question, problem."
    )
    answer_key: str | None = documented(
        None,
        "Column holding the reference answer; None: the first of answer, solution, ground_truth.",
    )
    template: str = documented(
        "chat",
        "How an example becomes the prompt text: 'raw' as it is, 'chat' through the "
        "tokenizer's chat template, 'torl' / 'search_r1' with ToRL's or Search-R1's "
        "instruction.",
    )
    system_prompt: str | None = documented(
        None,
        "System message put first in every prompt, in place of any other (the data's, ToRL's "
        "for 'torl'); '': no system message; None: the template's own (ToRL's for 'torl', the "
        "data's messages as they are).",
    )
    max_prompt_length: int = documented(
        160, "Longest prompt in tokens: longer ones are dropped (counted and logged)."
    )
    prompts_per_step: int = documented(
        8, "Prompts per training step; each is sampled `RolloutConfig.n` times."
    )
    val_size: int = documented(
        64,
        "Validation problems the built-in task generates; 0: no validation set (validation is "
        "skipped, as with a `train_file` and no `val_file`).",
    )
    builtin_train_size: int = documented(2000, "Training problems the built-in task generates.")
    builtin_levels: tuple[int, ...] = documented(
        (1, 2, 3, 4), "Difficulty levels of the built-in arithmetic task's problems."
    )
    seed: int = documented(
        0,
        "Seed of the prompt shuffle and of the built-in task's problems. The first epoch is "
        "Grain's `shuffle(seed)` order, each later one seeded by a hash of (seed, epoch), so "
        "neighbouring seeds share no epoch's order.",
    )

    def __post_init__(self):
        check_levels("DataConfig.builtin_levels", self.builtin_levels)

"""`RolloutConfig`: sampling, tools and engine sizes of an RL run's rollout (gin)."""

from __future__ import annotations

import dataclasses

import gin

from jaxrl_llm.config_checks import Ge, Interval, checked_fields


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    n=Ge(1),
    max_new_tokens=Ge(1),
    temperature=Ge(0),
    top_k=Ge(0),
    top_p=Interval(gt=0, le=1),
    max_tool_calls=Ge(0),
    search_k=Ge(1),
    max_slots=Ge(1),
    steps_per_call=Ge(1),
    val_temperature=Ge(0),
)
class RolloutConfig:
    n: int = 8  # samples per prompt (G)
    max_new_tokens: int = 96
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    # 'none' | 'python' (ToRL) | 'search' (Search-R1) | 'package.module:factory' (docs/tools.md)
    tool: str = "none"
    max_tool_calls: int = 2  # tool turns per sample (Search-R1's max turns)
    search_corpus: str | None = None  # jsonl corpus; None with the built-in retrieval task
    search_k: int = 3
    max_slots: int = 64  # concurrent decode slots
    steps_per_call: int = 8
    val_temperature: float = 0.0  # greedy validation

    def __post_init__(self):
        from jaxrl_llm.tools.factory import check_tool_name

        check_tool_name(self.tool)

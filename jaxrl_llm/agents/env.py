"""The environment API: what a multi-turn agent episode is made of.

An environment is built per episode (one sample) by its factory, `RolloutConfig.env`:
a built-in name or "package.module:factory" (`agents/factory.py`). The factory takes no
arguments (its own settings come from gin: make it `@gin.configurable`) and returns an
object with

- `tools`: JSON schemas of its tools (as `apply_chat_template(tools=...)` takes them; may be
  empty), rendered into the prompt by the checkpoint's own chat template;
- `reset(row) -> list of chat messages`: the episode's start from its whole data row (the
  same messages for every sample of a row, so a group shares its prompt);
- `step(turn: Turn) -> StepResult`: the model's turn (its text and parsed calls) in; the
  observation messages (usually `tool` messages), the turn's reward, whether the episode is
  done, and metrics out. `turn.final` is set when the sampler ends the episode (turn limit or
  token budget): the environment scores it and its observations are not shown;
- `close()`: called when the episode ends, and for every open episode when the run stops or
  fails.

Text-format environments (raw-text tools such as ToRL's code blocks and Search-R1's tags:
`agents.ToolEnv`) also set `stop_strings`, the strings that end a model turn (they stay in
the response and are trained), and may set the tool turn rules `turn_ends_on_eos` /
`sees_special_tokens` (`tools.protocol.turn_rules`). Their turns are read differently:
`Turn.text` is the sample's whole response so far (observations included, as a raw-text tool
reads it), nothing is parsed for them (`Turn.calls` is empty: the environment reads its own
format), and a `str` observation is appended as it is, as plain text (a special token's
string in it is ordinary characters; markup of the environment's own is an
`tools.special_tokens.Observation`), not rendered by the template. A
`reset` that returns no messages keeps the data pipeline's prompt for the row (`DataConfig`:
template, system prompt, chat template), token for token; such an environment has no tool
schemas. An environment that sets `uses_run_reward = True` leaves scoring to the run's
reward (`RewardConfig`), which scores each finished episode's response with its row as it
scores a plain sample; its step rewards must be 0.

The episode's reward is the turns' rewards combined by `EpisodeConfig.reward_rule`:
"final" (the last turn's), "sum", or "discounted" (sum of gamma^(T-1-t) r_t: earlier turns
count less, as a return seen from the episode's end). With `reward_placement = "turns"`
(rule "sum") each turn's reward also stays on the turn's last token for training
(`Completion.turn_rewards`), so GAE and REINFORCE++ credit the turn that earned it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import gin

from jaxrl_llm.agents.tool_calls import MalformedCall, ToolCall
from jaxrl_llm.config_checks import ConfigError, Interval, checked_fields, documented

Messages = list[dict[str, Any]]
REWARD_RULES = ("final", "sum", "discounted")


@dataclasses.dataclass(frozen=True)
class Turn:
    """One model turn: its text (calls included, special tokens removed), the calls parsed
    from it, those that could not be, and whether the sampler ended the episode here."""

    text: str
    calls: tuple[ToolCall, ...] = ()
    malformed: tuple[MalformedCall, ...] = ()
    final: bool = False


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What an environment answers to a turn: `observations` are messages (rendered by the
    chat template; their strings are plain text, the template's markers special) or, in a
    text format, the text to append as it is (plain text unless an `Observation`)."""

    observations: Messages | str = dataclasses.field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    @property
    def tools(self) -> Sequence[dict[str, Any]]: ...

    def reset(self, row: Mapping[str, Any]) -> Messages: ...

    def step(self, turn: Turn) -> StepResult: ...

    def close(self) -> None: ...


@gin.configurable
@dataclasses.dataclass(frozen=True)
@checked_fields(
    reward_rule=REWARD_RULES,
    reward_placement=("end", "turns"),
    discount=Interval(ge=0, le=1),
)
class EpisodeConfig:
    """How agent episodes (`RolloutConfig.env`) are read and scored (docs/agents.md)."""

    tool_format: str = documented(
        "qwen",
        "How the model writes tool calls: 'qwen' (= 'hermes', <tool_call>{json}</tool_call>, "
        "Qwen2.5/Qwen3), 'llama3_json' (Llama 3.1/3.2 JSON calls) or a format registered "
        "with agents.register_parser (by the environment's module).",
    )
    reward_rule: str = documented(
        "final", "How an episode's turn rewards combine: 'final', 'sum' or 'discounted'."
    )
    discount: float = documented(1.0, "gamma of the 'discounted' rule.")
    reward_placement: str = documented(
        "end",
        "Where an episode's reward goes for training: 'end' (the combined reward on the "
        "last token) or 'turns' (each turn's reward on the turn's last token, for GAE and "
        "REINFORCE++; GRPO and RLOO see their sum; needs reward_rule 'sum').",
    )

    def __post_init__(self):
        from jaxrl_llm.agents.tool_calls import parse_turn

        parse_turn(self.tool_format, "")  # an unknown format names the registered ones
        if self.reward_placement == "turns" and self.reward_rule != "sum":
            raise ConfigError(
                "EpisodeConfig.reward_placement = 'turns' needs reward_rule = 'sum' (got "
                f"{self.reward_rule!r}): rewards on the turns' tokens add up to the score the "
                "outcome estimators and the metrics read, and discounting is the estimator's "
                "own (AlgoConfig.gamma)"
            )


def combine_rewards(rewards: Sequence[float], rule: str, discount: float = 1.0) -> float:
    """An episode's reward from its turns' rewards (see the module docstring)."""
    if rule not in REWARD_RULES:
        raise ValueError(f"reward rule {rule!r}: expected one of {', '.join(REWARD_RULES)}")
    if not rewards:
        return 0.0
    if rule == "final":
        return float(rewards[-1])
    if rule == "sum":
        return float(sum(rewards))
    last = len(rewards) - 1
    return float(sum(r * discount ** (last - t) for t, r in enumerate(rewards)))

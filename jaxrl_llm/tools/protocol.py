"""What the rollout driver calls between model turns: the `Tool` protocol.

One tool turn, as the rollout driver runs it:
  1. The model generates until one of `tool.stop_strings`; the stop string stays in the
     response (it is the model's own writing, so it is trained) and ends the text handed
     to the tool, also when the token that completed it carries more text (">\n" after
     "</search"): that text stays in the response's tokens only (`text_for_tool`). A stop
     string that is not the tool's (`RolloutConfig.stop`) ends the sample (`hands_over`).
  2. `observation = tool(text_so_far)`; None means "no call here": the sample is finished.
  3. The observation is tokenised, appended, and masked out of the policy loss and the KL.
     It is plain text: a special token's string in it ("<|im_end|>") is ordinary characters,
     never the control token (`special_tokens.encode_observation`, on every backend). A
     tool that writes markup of its own (a chat template's turn markers) returns a
     `special_tokens.Observation`, a `str` whose markup parts keep their special tokens.
  4. Generation continues, for at most the configured number of tool calls.
A tool whose turns end with the model's end-of-turn token rather than a stop string (chat
tool calling, `agents/chat.py`) sets `turn_ends_on_eos = True`: a sample that stops on EOS is
handed to it too, and None ends the sample as "eos". `sees_special_tokens = True` hands it the
text with special tokens kept (the template's turn markers). `turn_rules` reads both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tool(Protocol):
    """A tool: the model's text so far in, the observation text to append out (or None),
    plain text unless it is an `Observation` with markup parts (step 3 above). Samplers call
    it from worker threads, several samples at once; `close()`, when it has one, runs when
    the run ends or fails."""

    name: str
    stop_strings: tuple[str, ...]

    def __call__(self, text: str) -> str | None: ...


@runtime_checkable
class EpisodeTool(Protocol):
    """A tool that keeps one episode per sample (`agents.Episodes`): the sampler passes the
    sample's position (`prompt` in the `generate` call, `sample` of its n) with its text."""

    def observe_episode(self, prompt: int, sample: int, text: str) -> str | None: ...


# What a sampler's `generate(..., tool=)` takes: a `Tool` (or any text -> observation
# callable) or an `EpisodeTool`.
ToolCallback = Callable[[str], "str | None"] | EpisodeTool


@dataclasses.dataclass(frozen=True)
class TurnRules:
    """When a sampler hands a sample to its tool, and what text it hands over."""

    on_eos: bool = False  # a turn also ends on the end-of-turn (EOS) token
    special_tokens: bool = False  # the text keeps special tokens


def turn_rules(tool: object) -> TurnRules:
    """A tool's `TurnRules`, from its optional `turn_ends_on_eos` / `sees_special_tokens`."""
    return TurnRules(
        on_eos=bool(getattr(tool, "turn_ends_on_eos", False)),
        special_tokens=bool(getattr(tool, "sees_special_tokens", False)),
    )


def ask(tool: ToolCallback, prompt: int, sample: int, text: str) -> str | None:
    """The tool's observation after a sample's turn: `tool.observe_episode(prompt, sample,
    text)` for an `EpisodeTool` (`prompt` is the prompt's position in the `generate` call),
    else `tool(text)`."""
    if isinstance(tool, EpisodeTool):
        return tool.observe_episode(prompt, sample, text)
    return tool(text)


def hands_over(tool: object, reason: str, stop: str | None = None) -> bool:
    """Whether a sample that finished its turn for `reason` (on stop string `stop`) goes to
    `tool`: on one of the tool's own `stop_strings` (on any stop string for a callable
    without them), or on EOS when its turns end there. Any other stop string is the run's
    own (`RolloutConfig.stop`) and ends the sample."""
    if reason == "stop":
        own = getattr(tool, "stop_strings", None)
        return own is None or stop in own
    return reason == "eos" and turn_rules(tool).on_eos


def text_for_tool(text: str, turn: str, stop: str | None) -> str:
    """The text handed to the tool: the response so far (`text`), ending right after the
    stop string its turn (`turn`: that turn's text, decoded alike) stopped on. The token
    that completes a stop string may carry more text (">\n" completes "</search>"): those
    characters stay in the sample's tokens, not in the tool's text. Unchanged after an EOS
    turn (`stop` None) or when the tool's text does not hold the stop string (one made of
    special tokens it does not see)."""
    if stop is None or stop not in turn:
        return text
    after = turn[turn.index(stop) + len(stop) :]
    return text[: len(text) - len(after)] if after and text.endswith(after) else text


@runtime_checkable
class ReportsMetrics(Protocol):
    """Optional beside `Tool`: a tool that reads its own results back from the finished
    responses (the Python tool: the share of its runs that succeeded). The rollout stage
    logs whatever it returns with the step's `env/*` metrics, so what a tool measures is
    decided by the tool, not by its name."""

    def response_metrics(self, responses: Sequence[str]) -> dict[str, float]: ...

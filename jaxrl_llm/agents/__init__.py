"""Agents: tool calls in the checkpoint's chat format (`tool_calls`), Python functions as
tools with schemas, timeouts and metrics (`functions`), the rollout tool that runs them
between model turns on any sampler backend (`chat`), and environments whose episodes are
the samples (`env`, `episodes`; the built-in `arithmetic`). See docs/agents.md."""

from jaxrl_llm.agents.chat import ChatFormat, ChatToolUse
from jaxrl_llm.agents.env import Environment, EpisodeConfig, StepResult, Turn, combine_rewards
from jaxrl_llm.agents.episodes import Episodes
from jaxrl_llm.agents.factory import SharedEnvFactory
from jaxrl_llm.agents.functions import FunctionTool, ToolBox
from jaxrl_llm.agents.tool_calls import (
    PARSERS,
    MalformedCall,
    ParsedTurn,
    ToolCall,
    parse_turn,
    register_parser,
)

__all__ = [
    "PARSERS",
    "ChatFormat",
    "ChatToolUse",
    "Environment",
    "EpisodeConfig",
    "Episodes",
    "FunctionTool",
    "MalformedCall",
    "ParsedTurn",
    "SharedEnvFactory",
    "StepResult",
    "ToolBox",
    "ToolCall",
    "Turn",
    "combine_rewards",
    "parse_turn",
    "register_parser",
]

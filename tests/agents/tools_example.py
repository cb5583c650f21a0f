"""Two tools for a chat-format agent: the worked example of docs/agents.md.

`make_tools(tokenizer=...)` is a rollout tool factory: `RolloutConfig.tool =
"tools_example:make_tools"` with this folder on PYTHONPATH. The model calls the tools in its
template's format (Qwen: <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}
</tool_call>); each call is answered as a `tool` message rendered by the same template.
"""

from jaxrl_llm.agents import ChatToolUse, ToolBox
from jaxrl_llm.agents.arithmetic import add  # a built-in tool, reused

KM_PER = {"km": 1.0, "m": 0.001, "mile": 1.609344}


def to_km(value: float, unit: str) -> float:
    """Convert a distance to kilometres.

    Args:
        value: The distance.
        unit: Its unit: km, m or mile.
    """
    if unit not in KM_PER:
        raise ValueError(f"unknown unit {unit!r}")
    return round(value * KM_PER[unit], 6)


def make_tools(tokenizer):
    return ChatToolUse(ToolBox([add, to_km], timeout_s=5.0), tokenizer, fmt="qwen")

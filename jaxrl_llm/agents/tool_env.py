"""A rollout tool as an environment: `ToolEnv`, how `RolloutConfig.tool` runs.

    factory = tool_env_factory(PythonTool())      # one tool, shared by every episode
    episodes = Episodes(factory, rows, n, tokenizer, EpisodeConfig(), prompts=pipeline_ids)

A `Tool` (`tools/protocol.py`: ToRL's Python interpreter, Search-R1's retriever, a plug-in)
reads the response so far and answers with the text to append, or None to end the sample.
`ToolEnv` puts it behind the environment API (`agents/env.py`) in the text format: its turns
end on the tool's stop strings (and on the end-of-turn token when the tool says so), each
turn hands the tool the whole response so far, a `str` observation is appended as it is (as
plain text: `tools.special_tokens.encode_observation`), the
prompt is the data pipeline's (`reset` returns no messages), and the run's reward scores the
finished response (`uses_run_reward`). So an episode has exactly the tokens, masks and
rewards the tool alone gives through the sampler (`tests/agents/test_tool_env.py` checks it
on the JAX engine and on vLLM). A turn the tool answers counts as a call of it:
`tools/<name>/{calls,ran,latency_s}`, as the chat format's tools report (`agents.functions`).

The tool is built once per run and shared by all episodes (a sandbox's worker pool, a BM25
index, a client): `close()` of an episode leaves it open; the rollout stage closes it when the
run ends or fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from jaxrl_llm.agents.env import Messages, StepResult, Turn
from jaxrl_llm.tools.protocol import Tool, turn_rules


class ToolEnv:
    """One episode over a shared `Tool` (see the module docstring)."""

    tools: tuple[dict[str, Any], ...] = ()
    uses_run_reward = True

    def __init__(self, tool: Tool):
        rules = turn_rules(tool)
        self.tool = tool
        self.stop_strings = tuple(tool.stop_strings)
        self.turn_ends_on_eos = rules.on_eos
        self.sees_special_tokens = rules.special_tokens

    def reset(self, row: Mapping[str, Any]) -> Messages:
        """No messages: the episode's prompt is the data pipeline's for `row`."""
        return []

    def step(self, turn: Turn) -> StepResult:
        """The tool's answer to the response so far (`turn.text`); None ends the episode.
        The sampler's own end (`turn.final`) asks nothing."""
        if turn.final:
            return StepResult(done=True)
        t0 = time.perf_counter()
        observation = self.tool(turn.text)
        if observation is None:
            return StepResult(done=True)
        key = f"tools/{self.tool.name}/"
        metrics = {key + "calls": 1.0, key + "ran": 1.0,
                   key + "latency_s": time.perf_counter() - t0}  # fmt: skip
        return StepResult(observations=observation, metrics=metrics)

    def close(self) -> None:
        """Nothing per episode: the shared tool stays open for the others."""


def tool_env_factory(tool: Tool) -> Callable[[], ToolEnv]:
    """The environment factory that wraps `tool` (shared) in a `ToolEnv` per episode."""
    return lambda: ToolEnv(tool)

"""Environment episodes in a rollout: `Episodes`, the sampler's tool for one batch.

    episodes = Episodes(factory, rows, n, tokenizer, EpisodeConfig())
    completions = sampler.generate(episodes.prompts, sampling, tool=episodes,
                                   on_finish=lambda i, c: scores.append(episodes.finish(i, c)))
    episodes.close()

One environment per sample (`n` per row), reset from the row; the row's prompt is its reset
messages rendered by the checkpoint's chat template with the environment's tool schemas
(`tools=`), and every sample of a row must get the same messages (a group shares its prompt).
Each model turn that ends on the end-of-turn token is parsed in the configured format and
handed to its environment's `step`; the observation messages are rendered by the template
and appended (masked); `done` ends the sample. `finish` ends an episode the sampler ended
(turn limit, token budget, a step that raised) with a `final` step, closes its environment,
and returns the episode's reward (`EpisodeConfig.reward_rule`; a final step that raises too
is logged and leaves the rewards of the steps before it). `close` closes every environment
still open, also when generation failed.

Metrics: `metrics()` gives counters, so batches and hosts add up (`functions.sum_metrics`):
the environments' own, summed over turns and episodes (an environment reports counts), and
`env/episodes`, `env/turns`, `env/calls` (well-formed), `env/malformed`, `env/reward_sum`;
`summarise` turns the totals into `env/{turns,calls,malformed,reward}/mean` per episode and
`env/well_formed_share` (well-formed calls out of all attempts; 1 with none).

Text-format environments (`stop_strings` set: `agents.ToolEnv`, raw-text tools) run the same
way with their own turn rules: the sampler stops a turn on their stop strings, the
environment gets the whole response so far, a turn it answers counts as a call, and an
episode whose `reset` gives no messages starts from the data pipeline's prompt (`prompts`).
When the environment `uses_run_reward`, the caller scores the finished responses with the
run's reward and `env/reward_sum` is not counted (docs/agents.md).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.agents.chat import ChatFormat
from jaxrl_llm.agents.env import Environment, EpisodeConfig, Turn, combine_rewards
from jaxrl_llm.agents.functions import sum_metrics
from jaxrl_llm.tools.protocol import turn_rules
from jaxrl_llm.types import Completion

log = logging.getLogger(__name__)


class _Episode:
    def __init__(self, env: Environment):
        self.env = env
        self.rewards: list[float] = []
        self.metrics: list[Mapping[str, float]] = []
        self.calls = self.malformed = 0
        self.done = self.closed = False

    def step(self, turn: Turn):
        result = self.env.step(turn)
        self.rewards.append(float(result.reward))
        self.metrics.append(dict(result.metrics))
        self.calls += len(turn.calls)
        self.malformed += len(turn.malformed)
        self.done = self.done or bool(result.done) or turn.final
        return result

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.env.close()


class Episodes:
    """The rollout tool over one batch's episodes (see the module docstring)."""

    name = "env"

    def __init__(
        self,
        factory: Callable[[], Environment],
        rows: Sequence[Mapping[str, Any]],
        n: int,
        tokenizer: Any,
        cfg: EpisodeConfig,
        *,
        prompts: Sequence[np.ndarray] | None = None,
    ):
        """`prompts`: the data pipeline's prompt token ids of `rows`, the prompts of episodes
        whose `reset` gives no messages."""
        self.cfg, self.n, self.tokenizer = cfg, n, tokenizer
        self.episodes: list[_Episode] = []
        try:
            self.prompts = [
                self._start(factory, row, None if prompts is None else prompts[i])
                for i, row in enumerate(rows)
            ]
            self._read_rules(self.episodes[0].env if self.episodes else None)
        except BaseException:
            self.close()
            raise

    def _read_rules(self, env: Environment | None) -> None:
        """The batch's turn rules, from its first environment (chat turns without one)."""
        stops = getattr(env, "stop_strings", None)
        self.text = stops is not None  # a text format (see the module docstring)
        self.uses_run_reward = bool(getattr(env, "uses_run_reward", False))
        rules = turn_rules(env)
        self.stop_strings: tuple[str, ...] = () if stops is None else tuple(stops)
        self.turn_ends_on_eos = rules.on_eos if self.text else True
        self.sees_special_tokens = rules.special_tokens if self.text else True
        if not self.text:
            _ = self.chat  # built here, not first in the sampler's worker threads
        if self.uses_run_reward and self.cfg.reward_placement == "turns":
            raise ValueError(
                "EpisodeConfig.reward_placement = 'turns' with an environment scored by the "
                "run's reward (a rollout tool, `uses_run_reward`): no turn has a reward of its "
                "own to place; use 'end'"
            )

    @functools.cached_property
    def chat(self) -> ChatFormat:
        """The chat template's arithmetic (built when first needed: a text format may never
        need it; an unknown `tool_format` fails here)."""
        return ChatFormat(self.tokenizer, self.cfg.tool_format)

    def _start(
        self, factory: Callable[[], Environment], row: Mapping[str, Any], pipeline
    ) -> np.ndarray:
        episodes: list[_Episode] = []
        for _ in range(self.n):  # each recorded as built: a failing factory leaks none
            episodes.append(_Episode(factory()))
            self.episodes.append(episodes[-1])
        started = [e.env.reset(row) for e in episodes]
        if any(m != started[0] for m in started[1:]):
            raise ValueError(
                f"the environment's reset gave different messages for one row "
                f"({row.get('id', '?')}): the samples of a group must share their prompt"
            )
        tools = list(episodes[-1].env.tools)
        if not started[0]:
            return self._pipeline_prompt(row, pipeline, tools)
        text = self.chat.render(started[0], generation_prompt=True, tools=tools)
        return np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)

    @staticmethod
    def _pipeline_prompt(row: Mapping[str, Any], pipeline, tools: list) -> np.ndarray:
        """The data pipeline's prompt of `row`, for an environment that adds no messages."""
        where = f"row {row.get('id', '?')}"
        if tools:
            raise ValueError(
                f"{where}: the environment's reset gave no messages but it has tool schemas, "
                "which only a prompt it renders can show; return the prompt messages"
            )
        if pipeline is None:
            raise ValueError(
                f"{where}: the environment's reset gave no messages (keep the data "
                "pipeline's prompt) but no pipeline prompts were given to Episodes(prompts=)"
            )
        return np.asarray(pipeline, np.int32)

    def observe_episode(self, prompt: int, sample: int, text: str) -> str | None:
        """The observation after a sample's turn (`text`: its response so far), or None
        when its environment says the episode is done."""
        episode = self.episodes[prompt * self.n + sample]
        if self.text:  # the whole response so far; a turn it answers is a call
            result = episode.step(Turn(text))
            end = ""
            if not episode.done:
                episode.calls += 1
        else:
            turn, parsed, end = self.chat.parse(text)
            result = episode.step(Turn(turn, parsed.calls, parsed.malformed))
        if episode.done:
            return None
        if isinstance(result.observations, str):
            return result.observations
        return self.chat.observation(list(result.observations), end)

    def finish(self, index: int, completion: Completion) -> float:
        """The reward of episode `index` (prompt-major) after its sample ended, with a
        `final` step when the sampler ended it; its environment is closed. A final step
        that raises is logged and the episode scores the rewards its earlier steps gave:
        the failure stays in its sample, as a step that raises during generation does."""
        episode = self.episodes[index]
        try:
            if not episode.done:
                self._final_step(episode, completion)
        except Exception as e:  # one environment's failure is not the batch's
            log.warning("episode %d: the final step raised, scored without it: %r", index, e)
        finally:
            episode.close()
        return combine_rewards(episode.rewards, self.cfg.reward_rule, self.cfg.discount)

    def _final_step(self, episode: _Episode, completion: Completion) -> None:
        """The `final` step on the sample's last model turn (an observation the budget cut
        short is not part of it)."""
        model = np.flatnonzero(np.asarray(completion.response_mask))
        kept = completion.token_ids[: model[-1] + 1] if len(model) else []
        skip = not self.sees_special_tokens
        text = self.tokenizer.decode(list(kept), skip_special_tokens=skip)
        if self.text:
            episode.step(Turn(text, final=True))
        else:
            turn, parsed, _ = self.chat.parse(text)
            episode.step(Turn(turn, parsed.calls, parsed.malformed, final=True))

    def placed(self, index: int, completion: Completion) -> Completion:
        """`completion` with its episode's turn rewards when they are placed on the turns'
        tokens (`EpisodeConfig.reward_placement = "turns"`); else unchanged. After `finish`."""
        if self.cfg.reward_placement != "turns":
            return completion
        rewards = tuple(self.episodes[index].rewards)
        return dataclasses.replace(completion, turn_rewards=rewards)

    def metrics(self) -> dict[str, float]:
        """Counters of this batch's episodes (see the module docstring)."""
        eps = self.episodes
        rule, gamma = self.cfg.reward_rule, self.cfg.discount
        return {
            **sum_metrics([m for e in eps for m in e.metrics]),
            "env/episodes": float(len(eps)),
            "env/turns": float(sum(len(e.rewards) for e in eps)),
            "env/calls": float(sum(e.calls for e in eps)),
            "env/malformed": float(sum(e.malformed for e in eps)),
            **({} if self.uses_run_reward else {
                "env/reward_sum": sum(combine_rewards(e.rewards, rule, gamma) for e in eps)
            }),
        }  # fmt: skip

    def close(self) -> None:
        """Close every environment still open; each closer runs even if another raises."""
        errors = []
        for e in self.episodes:
            try:
                e.close()
            except Exception as err:  # the others still close
                errors.append(err)
        if errors:
            raise errors[0]


def summarise(total: Mapping[str, float]) -> dict[str, float]:
    """Summed `Episodes.metrics` counters as per-episode means and the well-formed share;
    anything else passes through. Without episodes, unchanged."""
    episodes = total.get("env/episodes", 0.0)
    if not episodes:
        return dict(total)
    out = {k: v for k, v in total.items() if k not in _COUNTERS}
    for name in ("turns", "calls", "malformed"):
        out[f"env/{name}/mean"] = total[f"env/{name}"] / episodes
    if "env/reward_sum" in total:  # not with the run's reward (`uses_run_reward`)
        out["env/reward/mean"] = total["env/reward_sum"] / episodes
    attempts = total["env/calls"] + total["env/malformed"]
    out["env/well_formed_share"] = total["env/calls"] / attempts if attempts else 1.0
    return out


_COUNTERS = ("env/episodes", "env/turns", "env/calls", "env/malformed", "env/reward_sum")

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
(turn limit, token budget) with a `final` step, closes its environment, and returns the
episode's reward (`EpisodeConfig.reward_rule`). `close` closes every environment still open,
also when generation failed.

Metrics: `metrics()` gives counters, so batches and hosts add up (`functions.sum_metrics`):
the environments' own, summed over turns and episodes (an environment reports counts), and
`env/episodes`, `env/turns`, `env/calls` (well-formed), `env/malformed`, `env/reward_sum`;
`summarise` turns the totals into `env/{turns,calls,malformed,reward}/mean` per episode and
`env/well_formed_share` (well-formed calls out of all attempts; 1 with none).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.agents.chat import ChatFormat
from jaxrl_llm.agents.env import Environment, EpisodeConfig, Turn, combine_rewards
from jaxrl_llm.agents.functions import sum_metrics
from jaxrl_llm.types import Completion


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
    stop_strings: tuple[str, ...] = ()
    turn_ends_on_eos = True
    sees_special_tokens = True

    def __init__(
        self,
        factory: Callable[[], Environment],
        rows: Sequence[Mapping[str, Any]],
        n: int,
        tokenizer: Any,
        cfg: EpisodeConfig,
    ):
        self.cfg, self.n, self.tokenizer = cfg, n, tokenizer
        self.chat = ChatFormat(tokenizer, cfg.tool_format)
        self._lock = threading.Lock()
        self.episodes: list[_Episode] = []
        try:
            self.prompts = [self._start(factory, row) for row in rows]
        except BaseException:
            self.close()
            raise

    def _start(self, factory: Callable[[], Environment], row: Mapping[str, Any]) -> np.ndarray:
        started = []
        for _ in range(self.n):
            episode = _Episode(factory())
            self.episodes.append(episode)
            started.append(episode.env.reset(row))
        if any(m != started[0] for m in started[1:]):
            raise ValueError(
                f"the environment's reset gave different messages for one row "
                f"({row.get('id', '?')}): the samples of a group must share their prompt"
            )
        text = self.chat.render(
            started[0], generation_prompt=True, tools=list(self.episodes[-1].env.tools)
        )
        return np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)

    def observe_episode(self, prompt: int, sample: int, text: str) -> str | None:
        """The observation after a sample's turn (`text`: its response so far), or None
        when its environment says the episode is done."""
        episode = self.episodes[prompt * self.n + sample]
        turn, parsed, end = self.chat.parse(text)
        result = episode.step(Turn(turn, parsed.calls, parsed.malformed))
        if episode.done:
            return None
        return self.chat.observation(list(result.observations), end)

    def finish(self, index: int, completion: Completion) -> float:
        """The reward of episode `index` (prompt-major) after its sample ended, with a
        `final` step when the sampler ended it; its environment is closed."""
        episode = self.episodes[index]
        try:
            if not episode.done:
                # The model's last turn: an observation the budget cut short is not part of it.
                model = np.flatnonzero(np.asarray(completion.response_mask))
                kept = completion.token_ids[: model[-1] + 1] if len(model) else []
                text = self.tokenizer.decode(list(kept), skip_special_tokens=False)
                turn, parsed, _ = self.chat.parse(text)
                episode.step(Turn(turn, parsed.calls, parsed.malformed, final=True))
        finally:
            episode.close()
        return combine_rewards(episode.rewards, self.cfg.reward_rule, self.cfg.discount)

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
            "env/reward_sum": sum(combine_rewards(e.rewards, rule, gamma) for e in eps),
        }

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
    out["env/reward/mean"] = total["env/reward_sum"] / episodes
    attempts = total["env/calls"] + total["env/malformed"]
    out["env/well_formed_share"] = total["env/calls"] / attempts if attempts else 1.0
    return out


_COUNTERS = ("env/episodes", "env/turns", "env/calls", "env/malformed", "env/reward_sum")

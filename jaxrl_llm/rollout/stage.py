"""The RL rollout stage: prompts in, scored samples out, with the trainer's live weights.

`RolloutStage.sync_weights(params)` once per step pushes the trainer's params to the
sampler (`rollout/sampler.py`: the JAX engine reads the same arrays when the layouts agree,
vLLM copies them in); `generate` samples `n` completions per prompt through it (tool turns
included), scores them, and with
several processes gathers every host's rows back into global-batch order; `validate` is the
greedy pass over the validation set. Rewards see each sample's whole data row (the prompt
pipeline's example); the reward pool's failures are counted (`reward_metrics`) and a batch
where too many samples made the reward raise stops the run (`RewardPool.check_errors`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import jax
import numpy as np

from jaxrl_llm.metrics.progress import bar
from jaxrl_llm.rewards import config as reward_config
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.sampler import PolicyWeights, Refresh, WeightPush, check_version
from jaxrl_llm.rollout.scoring import RewardCounts, StreamingScorer
from jaxrl_llm.sharding import hosts
from jaxrl_llm.types import FINISH_REASONS, Rollout

_STAGES = itertools.count()  # `RolloutStage._exchange`


class RolloutStage:
    """The RL rollout stage: the sampler (any backend) with the trainer's weights, the tool,
    scoring, the multi-host gather, and validation."""

    def __init__(
        self,
        cfg: RolloutConfig,
        policy,
        tokenizer,
        mesh,
        *,
        max_prompt_length: int,
        seed: int,
        rollout_dtype: str | None = None,
        corpus: Path | None = None,
        checkpoint: Path | None = None,
        sampling_mesh=None,
    ):
        """`mesh`: the training mesh. With several processes each host samples its share
        of the batch, and the results are gathered so every host continues with the whole
        batch. `seed` seeds every step's samples; `corpus` is the built-in retrieval task's
        (Search-R1 tool); `checkpoint` the HF folder `policy` was loaded from (a server
        backend such as vLLM loads its own copy from it); `sampling_mesh` the sampler's own
        devices (`MeshConfig.rollout_devices`; None: the training mesh's)."""
        from jaxrl_llm.agents.env import EpisodeConfig
        from jaxrl_llm.agents.factory import NO_ENV, env_factory
        from jaxrl_llm.agents.tool_env import tool_env_factory
        from jaxrl_llm.rollout.sampler import SamplerContext, build_sampler
        from jaxrl_llm.tools.factory import build_tool

        r = cfg
        self.cfg = cfg
        self.seed = seed
        self.tokenizer = tokenizer
        self.stop = tuple(r.stop)
        self._reward_counts = RewardCounts()
        # Built at start-up: a wrong plug-in path, or a Python tool with no safe sandbox
        # here, fails before the first step.
        self.tool = build_tool(r.tool, corpus=corpus, tokenizer=tokenizer)
        # A tool runs as a text-format environment over the one shared tool (`ToolEnv`);
        # an environment factory is checked at start-up (and, with `close`, owns what its
        # episodes share: closed with the tool).
        if self.tool is not None:
            self.env = tool_env_factory(self.tool)
        else:
            self.env = None if r.env == NO_ENV else env_factory(r.env)
        self.episode_cfg = EpisodeConfig()
        self._episode_metrics: list[dict[str, float]] = []
        ctx = SamplerContext(
            cfg=cfg, policy=policy, tokenizer=tokenizer, mesh=mesh, checkpoint=checkpoint,
            max_prompt_length=max_prompt_length, rollout_dtype=rollout_dtype,
            sampling_mesh=sampling_mesh,
        )  # fmt: skip
        try:
            self.sampler = build_sampler(ctx)
        except BaseException:
            self._close_shared()
            raise
        self.last_push = WeightPush(0, 0.0)
        # Several processes: the hosts' samples and tool counters are gathered by a device
        # collective, entered by every process in the same order from one thread; when
        # another thread samples beside the trainer's collectives (a multi-host overlapped
        # run sets this), through the coordination service by tag instead
        # (`hosts.exchange_objects`: any thread, but all of it passes through process 0's
        # service, so it is not the default). Tags name the stage (stages are built in the
        # same order on every process) and are never reused.
        self.exchange_by_tag = False
        self._exchange = f"stage{next(_STAGES)}"

    def _sampling(self, seed: int, *, n: int, temperature: float):
        from jaxrl_llm.rollout import SamplingParams

        r = self.cfg
        return SamplingParams(
            temperature=temperature,
            top_k=r.top_k,
            top_p=r.top_p,
            max_new_tokens=r.max_new_tokens,
            max_turn_tokens=r.max_turn_tokens,
            stop=self.stop,
            n=n,
            seed=seed,
        )

    def sync_weights(self, params) -> WeightPush:
        """Push the trainer's params to the sampler: `PolicyWeights` (the policy's whole
        State and its version, which `generate(..., version=)` checks) or a State alone (no
        version: validation, eval); the next `generate` and `validate` sample with them.
        Call once per step on every process. The JAX backend reads the same arrays when the
        layouts agree (with LoRA, the adapters each step and the frozen base once); a server
        backend copies them in."""
        if isinstance(params, PolicyWeights):
            self.last_push = self.sampler.push_weights(params.params, version=params.version)
        else:
            self.last_push = self.sampler.push_weights(params)
        return self.last_push

    @property
    def stages_weights(self) -> bool:
        """Whether the sampler can stage a push (`Sampler.stage_weights`), as a multi-host
        overlapped run needs."""
        return callable(getattr(self.sampler, "stage_weights", None))

    def stage_weights(self, weights: PolicyWeights) -> PolicyWeights:
        """`weights` with the cross-host part of their push done now, on this thread, for
        `sync_weights` from another thread (`Sampler.stage_weights`; `stages_weights`)."""
        staged = self.sampler.stage_weights(weights.params, weights.version)  # pyright: ignore[reportAttributeAccessIssue]
        return PolicyWeights(staged, weights.version)

    @property
    def last_sync_bytes(self) -> int:
        """Bytes of params the last `sync_weights` handed over."""
        return self.last_push.bytes

    def close(self) -> None:
        """Free the sampler (its memory, and a server backend's engine) and close the tool,
        the tool even when the sampler's close raises."""
        try:
            self.sampler.close()
        finally:
            self._close_shared()

    def release_weights(self) -> None:
        """The step's sampling is over: the sampler may drop what it holds of the weights
        until the next `sync_weights` (`Sampler.release`), so the update has that memory."""
        self.sampler.release()

    def _close_shared(self) -> None:
        """Close the tool and an environment factory's shared resources (`close`), the
        factory even when the tool's close raises."""
        try:
            close = getattr(self.tool, "close", None)
            if callable(close):
                close()
        finally:
            close = getattr(self.env, "close", None)
            if callable(close):
                close()

    def generate(
        self, batch, step: int, attempt: int, reward, version: int | None = None,
        refresh: Refresh | None = None,
    ) -> Rollout:  # fmt: skip
        """Scored samples of this host's `batch` (its share of the global batch) with the
        weights of the last `sync_weights`, gathered from every host in global-batch order: every
        process gets the same whole-batch `Rollout`. `version`: the step whose synchronous
        weights those are (`Rollout.policy_version`; default `step`); when given, the
        sampler must hold that version (`StaleWeightsError` before any sampling if not).
        `refresh`: newer weights for the samples still decoding (partial rollouts)."""
        if version is not None:
            held = self.sampler.policy_version
            if refresh is not None and held is not None and held > version:
                version = held  # partial rollouts: newer weights arrived in an earlier try
            check_version(held, version)
        r = self.cfg
        seed = int(np.random.default_rng([self.seed, step, attempt]).integers(2**31))
        sampling = self._sampling(seed, n=r.n, temperature=r.temperature)
        progress = bar(f"rollout {step}", len(batch) * r.n, unit="sample")
        on_progress = lambda done, total: progress.update(done - progress.n)
        swap = {} if refresh is None else {"refresh": refresh}  # only to backends that take it
        if self.env is not None:
            completions, scores, counts = self._episodes(
                batch, sampling, reward, on_progress, swap=swap
            )
        else:
            n = len(batch)
            prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in range(n)]
            # Each finished sample is scored while the rest decode (`StreamingScorer`).
            scorer = StreamingScorer(reward, [e for e in batch.examples for _ in range(r.n)])
            completions = self.sampler.generate(
                prompts, sampling, tool=self.tool, progress=on_progress,
                prompt_indices=_global_rows(n), on_finish=lambda i, c: scorer.add(i, c.text),
                **swap,
            )  # fmt: skip
            scores, counts = scorer.result()
        progress.close()
        answers = [a for a in batch.answers for _ in range(r.n)]
        mine = Rollout(
            completions=tuple(completions),
            answers=tuple(answers),
            prompt_ids=tuple(batch.ids),
            scores=np.asarray(scores, np.float32),
            group_size=r.n,
            policy_version=step if version is None else version,
        )
        rollout, counts = _gather_rows(mine, counts, self._tag(f"rollout/{step}/{attempt}"))
        self._reward_counts = self._reward_counts + counts
        counts.check(reward)
        return rollout

    def _episodes(self, batch, sampling, reward, progress=None, rows=None, swap=None):
        """Completions, scores and reward counts of `batch` (its `rows`; all by default) as
        environment episodes (`agents.Episodes`): the prompts are the environments' reset
        messages (or the pipeline's), the scores their combined rewards or, for an
        environment that `uses_run_reward` (a tool's), the run's `reward` of each finished
        response, scored while the rest decode; every environment is closed."""
        from jaxrl_llm.agents.episodes import Episodes

        assert self.env is not None
        mine = list(range(len(batch))) if rows is None else list(rows)
        examples = [batch.examples[i] for i in mine]
        pipeline = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in mine]
        episodes = Episodes(
            self.env, examples, sampling.n, self.tokenizer, self.episode_cfg, prompts=pipeline
        )
        scorer = None
        if episodes.uses_run_reward:
            scorer = StreamingScorer(reward, [e for e in examples for _ in range(sampling.n)])
        sampling = dataclasses.replace(sampling, stop=(*sampling.stop, *episodes.stop_strings))
        try:
            completions = self.sampler.generate(
                episodes.prompts, sampling, tool=episodes, progress=progress,
                prompt_indices=_global_rows(len(mine)) if rows is None else mine,
                on_finish=None if scorer is None else lambda i, c: scorer.add(i, c.text),
                **(swap or {}),
            )  # fmt: skip
            rewards = [episodes.finish(i, c) for i, c in enumerate(completions)]
            completions = [episodes.placed(i, c) for i, c in enumerate(completions)]
        finally:
            episodes.close()
        self._episode_metrics.append(episodes.metrics())
        scores, counts = scorer.result() if scorer is not None else (rewards, RewardCounts())
        return completions, scores, counts

    def _tag(self, name: str) -> str | None:
        """The exchange's tag when `exchange_by_tag`, else None (a device collective)."""
        return f"{self._exchange}/{name}" if self.exchange_by_tag else None

    def reward_metrics(self) -> dict[str, float]:
        """Over the `generate` calls since the last call (one step, every try, all hosts):
        `reward/errors` and `reward/timeouts`, samples whose reward raised or ran out of
        time; for each reward of the combination, `reward/<name>/mean`, its unweighted
        score averaged over the samples it scored (NaN: none), and `timing/reward/<name>`,
        the seconds spent scoring with it, summed over the calls, as a host's mean, and
        `reward/<name>/<count>`, what it counted, summed (a judge's `retries`, `unparsed`,
        `too_long`; docs/rewards.md, "Per-reward metrics")."""
        counts, self._reward_counts = self._reward_counts, RewardCounts()
        m: dict[str, float] = {"reward/errors": counts.errors, "reward/timeouts": counts.timeouts}
        for name, part in counts.parts.items():
            m[f"reward/{name}/mean"] = part.total / part.scored if part.scored else float("nan")
            m[f"timing/reward/{name}"] = part.seconds / jax.process_count()
            m.update({f"reward/{name}/{k}": v for k, v in part.counts.items()})
        return m

    def tool_metrics(self, step: int | None = None) -> dict[str, float]:
        """The tool's own counters since the last call (`metrics()`, e.g. a `ToolBox`'s
        `tools/<name>/{calls,errors,timeouts,latency_s}`), summed over hosts; a latency is
        the mean over all hosts' calls. Every process calls it at the same point: with a
        `step`, the one step that call covers (a tagged exchange when `exchange_by_tag`);
        without, on the trainer's thread (validation)."""
        from jaxrl_llm.agents.episodes import summarise
        from jaxrl_llm.agents.functions import sum_metrics

        read = getattr(self.tool, "metrics", None)
        own = cast(Mapping[str, float], read()) if callable(read) else {}
        mine = [dict(own), *self._episode_metrics]
        self._episode_metrics = []
        tag = None if step is None else self._tag(f"tools/{step}")
        return summarise(sum_metrics(hosts.allgather_objects(sum_metrics(mine), tag)))

    def env_metrics(self, rollout: Rollout) -> dict[str, float]:
        """`rollout/finish/<reason>`: each of `FINISH_REASONS`' share of the samples, 0
        included (a missing key would drop the step from that metric's mean over steps);
        with a tool, its call counts (and the tool's `response_metrics`)."""
        comps = rollout.completions
        reasons = [c.finish_reason for c in comps]
        m = {f"rollout/finish/{k}": reasons.count(k) / len(comps) for k in FINISH_REASONS}
        if self.tool is None:
            return m
        calls = np.asarray([c.tool_calls for c in comps], np.float32)
        m["env/tool_calls/mean"] = float(calls.mean())
        m["env/number_of_actions/mean"] = float(calls.mean())
        m["env/ratio_of_valid_action"] = float(np.mean(calls > 0))
        from jaxrl_llm.tools.protocol import ReportsMetrics

        if isinstance(self.tool, ReportsMetrics):  # e.g. the Python tool's code success rate
            m.update(self.tool.response_metrics([c.text for c in comps]))
        return m

    def validate(self, val, reward, correct: float) -> dict[str, float]:
        """Greedy (by default) pass over the validation set with the weights of the last
        `sync_weights`: `val/test_score` is the fraction of samples scoring at least
        `correct`."""
        if val is None:
            return {}
        r = self.cfg
        scorers: list[StreamingScorer] = []  # one per batch, scoring while the next decodes
        me, hosts_ = jax.process_index(), jax.process_count()
        results: list[tuple[list[float], RewardCounts]] = []  # episodes: scored already
        sampling = self._sampling(self.seed, n=1, temperature=r.val_temperature)
        for batch in val.iterator():
            # Multi-host: each host takes every process_count-th row of the batch.
            rows = range(me, len(batch), hosts_)
            if self.env is not None:
                results.append(self._episodes(batch, sampling, reward, rows=rows)[1:])
                continue
            prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in rows]
            scorer = StreamingScorer(reward, [batch.examples[i] for i in rows])
            self.sampler.generate(
                prompts, sampling, tool=self.tool, prompt_indices=list(rows),
                on_finish=lambda i, c, scorer=scorer: scorer.add(i, c.text),
            )  # fmt: skip
            scorers.append(scorer)
        results += [s.result() for s in scorers]
        mine = np.asarray([x for scores, _ in results for x in scores], np.float32)
        mine_counts = sum((counts for _, counts in results), RewardCounts())
        parts = hosts.allgather_objects((mine, mine_counts))
        scores = np.concatenate([p[0] for p in parts])
        counts = sum((p[1] for p in parts), RewardCounts())
        counts.check(reward)
        solved = reward_config.solved(scores, correct)
        return {
            "val/test_score": float(solved.mean()),
            "val/reward/mean": float(scores.mean()),
            "val/reward/errors": counts.errors,
            **{f"val/{k}": v for k, v in self.tool_metrics().items()},
        }


def _global_rows(local_rows: int) -> list[int]:
    """Positions in the global batch of this host's rows: the prompt pipeline gives host p
    rows p, p + P, p + 2P, ... (so sample seeds match a one-host run of the same batch)."""
    p, n = jax.process_index(), jax.process_count()
    return [p + n * r for r in range(local_rows)]


def _gather_rows(
    mine: Rollout, counts: RewardCounts, tag: str | None
) -> tuple[Rollout, RewardCounts]:
    """Every host's share of a step's rollout, interleaved back into global-batch order, and
    the reward failures of all hosts summed (`tag`: `hosts.allgather_objects`)."""
    everyone = hosts.allgather_objects((mine, counts), tag)
    parts = [p[0] for p in everyone]
    total = sum((p[1] for p in everyone), RewardCounts())
    if len(parts) == 1:
        return mine, total
    P, rows, G = len(parts), len(mine.prompt_ids), mine.group_size
    order = [(r, p) for r in range(rows) for p in range(P)]  # global row r * P + p
    group = lambda xs, r: xs[r * G : (r + 1) * G]
    return dataclasses.replace(
        mine,
        prompt_ids=tuple(parts[p].prompt_ids[r] for r, p in order),
        completions=tuple(c for r, p in order for c in group(parts[p].completions, r)),
        answers=tuple(a for r, p in order for a in group(parts[p].answers, r)),
        scores=np.concatenate([group(parts[p].scores, r) for r, p in order]),
    ), total

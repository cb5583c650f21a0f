"""The RL rollout stage: prompts in, scored samples out, with the trainer's live weights.

`RolloutStage.sync_weights(params)` once per step hands the trainer's params to the engine
(`hosts.WeightSync`: the same arrays when the layouts agree); `generate` samples `n`
completions per prompt through `RolloutDriver` (tool turns included), scores them, and with
several processes gathers every host's rows back into global-batch order; `validate` is the
greedy pass over the validation set. Rewards see each sample's whole data row (the prompt
pipeline's example); the reward pool's failures are counted (`reward_metrics`) and a batch
where too many samples made the reward raise stops the run (`RewardPool.check_errors`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from jaxrl_llm.metrics.progress import bar
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.scoring import RewardCounts, StreamingScorer
from jaxrl_llm.sharding import hosts
from jaxrl_llm.types import Rollout


class RolloutStage:
    """The RL rollout stage: engine and driver over the trainer's live weights, the tool,
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
    ):
        """`mesh`: the training mesh. With several processes each host samples on its own
        devices (`hosts.local_sampling_mesh`) with `cfg.max_slots` slots, and the results
        are gathered so every host continues with the whole batch. `seed` seeds every
        step's samples; `corpus` is the built-in retrieval task's (Search-R1 tool)."""
        from flax import nnx

        from jaxrl_llm.rollout import Engine, RolloutDriver
        from jaxrl_llm.tools.factory import build_tool

        r = cfg
        self.cfg = cfg
        self.seed = seed
        self.tokenizer = tokenizer
        self.engine = Engine(
            policy,
            max_concurrent_decodes=r.max_slots,
            max_cache_length=max_prompt_length + r.max_new_tokens + 1,
            max_prefill_length=max_prompt_length,
            mesh=hosts.local_sampling_mesh(mesh),
            tokenizer=tokenizer,
            keep_params=False,  # the trainer's live params come with every call
        )
        self.driver = RolloutDriver(
            self.engine,
            tokenizer,
            steps_per_call=r.steps_per_call,
            max_tool_turns=r.max_tool_calls,
        )
        self.stop = tuple(r.stop)
        self._reward_counts = RewardCounts()
        # Rollout weights may be narrower (e.g. bfloat16: half the bytes read per decoded
        # token); the trainer's master weights are untouched, and the gap shows in
        # rollout/logprob_diff/*. One jitted cast (and, multi-host, gather) per step.
        cast = _make_cast(rollout_dtype) if rollout_dtype else None
        self._sync = _AdapterSync(nnx.state(policy), mesh, self.engine.param_shardings, cast)
        # Built at start-up: a wrong plug-in path, or a Python tool with no safe sandbox
        # here, fails before the first step.
        self.tool = build_tool(r.tool, search_corpus=r.search_corpus or corpus, search_k=r.search_k)
        if self.tool is not None:
            self.stop = (*self.stop, *self.tool.stop_strings)

    def _sampling(self, seed: int, *, n: int, temperature: float):
        from jaxrl_llm.rollout import SamplingParams

        r = self.cfg
        return SamplingParams(
            temperature=temperature,
            top_k=r.top_k,
            top_p=r.top_p,
            max_new_tokens=r.max_new_tokens,
            stop=self.stop,
            n=n,
            seed=seed,
        )

    def sync_weights(self, params):
        """The trainer's params as the rollout reads them (`hosts.WeightSync`): the same
        arrays when the training and sampling layouts agree and nothing is cast, else one
        jitted re-layout/cast; multi-host, a full copy on each host's devices. With LoRA
        adapters only the adapters are handed over; the frozen base is synced once.
        Call once per step (on every process), before `generate`."""
        return self._sync(params)

    @property
    def last_sync_bytes(self) -> int:
        """Bytes of params the last `sync_weights` handed over (a pointer when the layouts
        agree and nothing is cast, else moved): the adapters' alone with LoRA."""
        return self._sync.last_bytes

    def generate(self, params, batch, step: int, attempt: int, reward) -> Rollout:
        """Scored samples of this host's `batch` (its share of the global batch) with
        `params` from `sync_weights`, gathered from every host in global-batch order: every
        process gets the same whole-batch `Rollout`. `step` is its policy version."""
        r = self.cfg
        seed = int(np.random.default_rng([self.seed, step, attempt]).integers(2**31))
        prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in range(len(batch))]
        progress = bar(f"rollout {step}", len(prompts) * r.n, unit="sample")
        # Each finished sample is scored while the rest decode (`StreamingScorer`).
        scorer = StreamingScorer(reward, [e for e in batch.examples for _ in range(r.n)])
        completions = self.driver.generate(
            prompts,
            self._sampling(seed, n=r.n, temperature=r.temperature),
            params=params,
            tool=self.tool,
            progress=lambda done, total: progress.update(done - progress.n),
            prompt_indices=_global_rows(len(prompts)),
            on_finish=lambda i, c: scorer.add(i, c.text),
        )
        progress.close()
        answers = [a for a in batch.answers for _ in range(r.n)]
        scores, counts = scorer.result()
        mine = Rollout(
            completions=tuple(completions),
            answers=tuple(answers),
            prompt_ids=tuple(batch.ids),
            scores=np.asarray(scores, np.float32),
            group_size=r.n,
            policy_version=step,
        )
        rollout, counts = _gather_rows(mine, counts)
        self._reward_counts = self._reward_counts + counts
        counts.check(reward)
        return rollout

    def reward_metrics(self) -> dict[str, float]:
        """`reward/errors` and `reward/timeouts`: samples whose reward raised or ran out of
        time in the `generate` calls since the last call (one step, all hosts)."""
        counts, self._reward_counts = self._reward_counts, RewardCounts()
        return {"reward/errors": counts.errors, "reward/timeouts": counts.timeouts}

    def env_metrics(self, rollout: Rollout) -> dict[str, float]:
        comps = rollout.completions
        reasons = [c.finish_reason for c in comps]
        m = {f"rollout/finish/{k}": reasons.count(k) / len(comps) for k in set(reasons)}
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

    def validate(self, params, val, reward, correct: float) -> dict[str, float]:
        """Greedy (by default) pass over the validation set: `val/test_score` is the fraction
        of samples scoring at least `correct`."""
        if val is None:
            return {}
        r = self.cfg
        scorers: list[StreamingScorer] = []  # one per batch, scoring while the next decodes
        params = self.sync_weights(params)
        me, hosts_ = jax.process_index(), jax.process_count()
        for batch in val.iterator():
            # Multi-host: each host takes every process_count-th row of the batch.
            rows = range(me, len(batch), hosts_)
            prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in rows]
            scorer = StreamingScorer(reward, [batch.examples[i] for i in rows])
            self.driver.generate(
                prompts,
                self._sampling(self.seed, n=1, temperature=r.val_temperature),
                params=params,
                tool=self.tool,
                prompt_indices=list(rows),
                on_finish=lambda i, c, scorer=scorer: scorer.add(i, c.text),
            )
            scorers.append(scorer)
        results = [s.result() for s in scorers]
        mine = np.asarray([x for scores, _ in results for x in scores], np.float32)
        mine_counts = sum((counts for _, counts in results), RewardCounts())
        parts = hosts.allgather_objects((mine, mine_counts))
        scores = np.concatenate([p[0] for p in parts])
        counts = sum((p[1] for p in parts), RewardCounts())
        counts.check(reward)
        solved = scores >= correct
        return {
            "val/test_score": float(solved.mean()),
            "val/reward/mean": float(scores.mean()),
            "val/reward/errors": counts.errors,
        }


def _global_rows(local_rows: int) -> list[int]:
    """Positions in the global batch of this host's rows: the prompt pipeline gives host p
    rows p, p + P, p + 2P, ... (so sample seeds match a one-host run of the same batch)."""
    p, n = jax.process_index(), jax.process_count()
    return [p + n * r for r in range(local_rows)]


def _gather_rows(mine: Rollout, counts: RewardCounts) -> tuple[Rollout, RewardCounts]:
    """Every host's share of a step's rollout, interleaved back into global-batch order, and
    the reward failures of all hosts summed."""
    everyone = hosts.allgather_objects((mine, counts))
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


class _AdapterSync:
    """`hosts.WeightSync` for a policy State; with LoRA adapters (`models.lora`), one sync
    for the adapters on every call and one for the frozen base, run again only when the
    base's arrays change (never, in an RL run): a step moves adapter bytes only."""

    def __init__(self, state, mesh, shardings, cast):
        from jaxrl_llm.models.lora import has_adapters, split_adapters

        self.last_bytes = 0
        self._lora = has_adapters(state)
        if not self._lora:
            self._all = hosts.WeightSync(state, mesh, shardings, cast=cast)
            return
        self._split = split_adapters
        (adapters, base), (ad_out, base_out) = split_adapters(state), split_adapters(shardings)
        self._adapters = hosts.WeightSync(adapters, mesh, ad_out, cast=cast)
        self._base = hosts.WeightSync(base, mesh, base_out, cast=cast)
        self._base_src: list | None = None
        self._base_synced = None

    def __call__(self, params):
        from flax import nnx

        from jaxrl_llm.models.lora import state_bytes

        if not self._lora:
            self.last_bytes = state_bytes(params)
            return self._all(params)
        adapters, base = self._split(params)
        leaves = jax.tree.leaves(base)
        self.last_bytes = state_bytes(adapters)
        if self._base_src is None or any(
            a is not b for a, b in zip(leaves, self._base_src, strict=True)
        ):
            self._base_synced, self._base_src = self._base(base), leaves
            self.last_bytes += state_bytes(base)
        assert self._base_synced is not None  # synced above on the first call
        return nnx.merge_state(self._adapters(adapters), self._base_synced)


def _make_cast(dtype: str):
    import jax.numpy as jnp

    from jaxrl_llm.models.config import as_dtype

    target = as_dtype(dtype)

    @jax.jit
    def cast(params):
        return jax.tree.map(
            lambda x: x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
        )

    return cast

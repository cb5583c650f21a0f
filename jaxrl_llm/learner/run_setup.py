"""What an RL run is built from: prompt data, the rollout side, rewards, run-dir files.

Kept apart from `rl_loop.py` so the loop reads as the algorithm's outline.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_llm.config import write_resolved_config
from jaxrl_llm.data import limr
from jaxrl_llm.data.examples import FieldMap
from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.sources import SourceConfig
from jaxrl_llm.data.tasks import arithmetic
from jaxrl_llm.learner.rl_config import RewardConfig, RLConfig
from jaxrl_llm.metrics.progress import bar
from jaxrl_llm.sharding import hosts

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PromptData:
    train: Any  # PromptPipeline
    val: Any  # PromptPipeline
    corpus: Path | None = None  # the built-in retrieval task's corpus


def prompt_data(cfg: RLConfig, tokenizer: Any, run_dir: Path) -> PromptData:
    """Train and validation pipelines; the built-in task is written to run_dir/data first."""
    d = cfg.data
    train_file, val_file, corpus = d.train_file, d.val_file, None
    if train_file is None and d.builtin_task == "retrieval":
        from jaxrl_llm.data.tasks import retrieval

        paths = retrieval.write_task(
            run_dir / "data", n_train=d.builtin_train_size, n_val=d.val_size, seed=d.seed
        )
        train_file, val_file, corpus = str(paths["train"]), str(paths["val"]), paths["corpus"]
    elif train_file is None:
        paths = arithmetic.write_splits(
            run_dir / "data",
            n_train=d.builtin_train_size,
            n_val=d.val_size,
            seed=d.seed,
            levels=d.builtin_levels,
        )
        train_file, val_file = str(paths["train"]), str(paths["val"])
    fields = FieldMap(
        prompt=(d.prompt_key,) if d.prompt_key else FieldMap().prompt,
        answer=(d.answer_key,) if d.answer_key else FieldMap().answer,
    )
    common = dict(
        fields=fields,
        template=d.template,
        system_prompt=d.system_prompt,
        max_prompt_length=d.max_prompt_length,
        seed=d.seed,
    )
    proc = dict(process_index=jax.process_index(), process_count=jax.process_count())
    train = build_prompt_pipeline(
        PipelineConfig(
            source=SourceConfig(train_file),
            global_batch_size=d.prompts_per_step,
            num_epochs=None,
            **common,
        ),
        tokenizer,
        **proc,
    )
    val = None
    if val_file is not None:
        val = build_prompt_pipeline(
            PipelineConfig(
                source=SourceConfig(val_file),
                global_batch_size=min(d.val_size, 64),
                num_epochs=1,
                shuffle=False,
                drop_remainder=False,
                **common,
            ),
            tokenizer,
        )
    for name, pipe in (("train", train), ("val", val)):
        if pipe is not None:
            log.info("%s prompts: %s", name, pipe.report.summary())
    return PromptData(train, val, corpus)


class Rollout:
    """The engine and driver, plus the tool callback and validation."""

    def __init__(self, cfg: RLConfig, policy, tokenizer, mesh, corpus: Path | None = None):
        """`mesh`: the training mesh. With several processes each host samples on its own
        devices (`hosts.local_sampling_mesh`) with `rollout.max_slots` slots, and the
        results are gathered so every host continues with the whole batch."""
        from flax import nnx

        from jaxrl_llm.rollout import Engine, RolloutDriver

        r = cfg.rollout
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.engine = Engine(
            policy,
            max_concurrent_decodes=r.max_slots,
            max_cache_length=cfg.cache_len,
            max_prefill_length=cfg.data.max_prompt_length,
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
        self.tool = None
        self.stop = tuple(r.stop)
        # Rollout weights may be narrower (e.g. bfloat16: half the bytes read per decoded
        # token); the trainer's master weights are untouched, and the gap shows in
        # rollout/logprob_diff/*. One jitted cast (and, multi-host, gather) per step.
        cast = _make_cast(cfg.policy.rollout_dtype) if cfg.policy.rollout_dtype else None
        self._sync = hosts.WeightSync(
            nnx.state(policy), mesh, self.engine.param_shardings, cast=cast
        )
        if r.tool == "python":
            from jaxrl_llm.tools import PythonTool

            self.tool = PythonTool()
        elif r.tool == "search":
            from jaxrl_llm.tools import make_search_tool

            self.tool = make_search_tool(r.search_corpus or corpus, k=r.search_k)
        if self.tool is not None:
            self.stop = (*self.stop, *self.tool.stop_strings)

    def _sampling(self, seed: int, *, n: int, temperature: float):
        from jaxrl_llm.rollout import SamplingParams

        r = self.cfg.rollout
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
        jitted re-layout/cast; multi-host, a full copy on each host's devices.
        Call once per step (on every process), before `generate`."""
        return self._sync(params)

    def generate(self, params, batch, step: int, attempt: int, reward=None) -> dict:
        """Samples for this host's `batch` (its share of the global batch); `params` come
        from `sync_weights`. With `reward`, scores too and gathers every host's share, in
        global-batch order: every process gets the same whole-batch result."""
        r = self.cfg.rollout
        seed = int(np.random.default_rng([self.cfg.seed, step, attempt]).integers(2**31))
        prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in range(len(batch))]
        progress = bar(f"rollout {step}", len(prompts) * r.n, unit="sample")
        completions = self.driver.generate(
            prompts,
            self._sampling(seed, n=r.n, temperature=r.temperature),
            params=params,
            tool=self.tool,
            progress=lambda done, total: progress.update(done - progress.n),
            prompt_indices=_global_rows(len(prompts)),
        )
        progress.close()
        exp = {
            "completions": completions,
            "answers": [a for a in batch.answers for _ in range(r.n)],
            "prompt_ids": list(batch.ids),
        }
        if reward is None:
            return exp
        exp["scores"] = np.asarray(
            reward.score([c.text for c in completions], exp["answers"]), np.float32
        )
        return _gather_rows(exp, r.n)

    def env_metrics(self, exp: dict) -> dict[str, float]:
        comps = exp["completions"]
        reasons = [c.finish_reason for c in comps]
        m = {f"rollout/finish/{k}": reasons.count(k) / len(comps) for k in set(reasons)}
        if self.tool is None:
            return m
        calls = np.asarray([c.tool_calls for c in comps], np.float32)
        m["env/tool_calls/mean"] = float(calls.mean())
        m["env/number_of_actions/mean"] = float(calls.mean())
        m["env/ratio_of_valid_action"] = float(np.mean(calls > 0))
        if self.cfg.rollout.tool == "python":
            from jaxrl_llm.tools.python_tool import is_error_output, output_blocks

            blocks = [b for c in comps for b in output_blocks(c.text)]
            ok = [not is_error_output(b) for b in blocks]
            m["env/code_success_rate"] = float(np.mean(ok)) if ok else 0.0
        return m

    def validate(self, params, val, reward) -> dict[str, float]:
        """Greedy (by default) pass over the validation set: `val/test_score` is accuracy."""
        if val is None:
            return {}
        r = self.cfg.rollout
        texts, answers = [], []
        params = self.sync_weights(params)
        me, hosts_ = jax.process_index(), jax.process_count()
        for batch in val.iterator():
            # Multi-host: each host takes every process_count-th row of the batch.
            rows = range(me, len(batch), hosts_)
            prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in rows]
            comps = self.driver.generate(
                prompts,
                self._sampling(self.cfg.seed, n=1, temperature=r.val_temperature),
                params=params,
                tool=self.tool,
                prompt_indices=list(rows),
            )
            texts += [c.text for c in comps]
            answers += [batch.answers[i] for i in rows]
        mine = np.asarray(reward.score(texts, answers), np.float32)
        scores = np.concatenate(hosts.allgather_objects(mine))
        correct = scores >= self.cfg.reward.correct
        return {"val/test_score": float(correct.mean()), "val/reward/mean": float(scores.mean())}


def _global_rows(local_rows: int) -> list[int]:
    """Positions in the global batch of this host's rows: the prompt pipeline gives host p
    rows p, p + P, p + 2P, ... (so sample seeds match a one-host run of the same batch)."""
    p, n = jax.process_index(), jax.process_count()
    return [p + n * r for r in range(local_rows)]


def _gather_rows(exp: dict, n: int) -> dict:
    """Every host's share of a step's experience, interleaved back into global-batch order."""
    parts = hosts.allgather_objects(exp)
    if len(parts) == 1:
        return exp
    P, rows = len(parts), len(exp["prompt_ids"])
    order = [(r, p) for r in range(rows) for p in range(P)]  # global row r * P + p
    out: dict[str, Any] = {
        "prompt_ids": [parts[p]["prompt_ids"][r] for r, p in order],
        "completions": [c for r, p in order for c in parts[p]["completions"][r * n : (r + 1) * n]],
        "answers": [a for r, p in order for a in parts[p]["answers"][r * n : (r + 1) * n]],
        "scores": np.concatenate([parts[p]["scores"][r * n : (r + 1) * n] for r, p in order]),
    }
    return out


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


def make_reward_pool(cfg: RewardConfig):
    from jaxrl_llm.rewards import RewardPool, get_reward

    options: dict[str, Any] = {"correct": cfg.correct, "incorrect": cfg.incorrect}
    if cfg.name == "math":
        options.update(code_failure_penalty=cfg.code_failure_penalty, timeout_s=cfg.timeout_s)
    fn = get_reward(cfg.name, **options)
    return RewardPool(
        fn, num_workers=cfg.workers, timeout_s=cfg.timeout_s, timeout_value=cfg.incorrect
    )


def record_samples(run_dir: Path, step: int, exp: dict) -> None:
    """LIMR's per-sample record: samples/step_N.jsonl with prompt id and reward."""
    if jax.process_index() != 0:  # every host holds the whole (gathered) batch
        return
    n = len(exp["completions"]) // max(len(exp["prompt_ids"]), 1)
    ids = [p for p in exp["prompt_ids"] for _ in range(n)]
    limr.record_samples(run_dir, step, ids, exp["scores"])


def write_config(run_dir: Path) -> Path:
    return write_resolved_config(run_dir)


def summary_line(step: int, m: dict[str, float]) -> str:
    keys = [
        ("score", "critic/score/mean"),
        ("val", "val/test_score"),
        ("len", "response_length/mean"),
        ("pg", "actor/pg_loss"),
        ("kl", "actor/kl_loss"),
        ("ent", "actor/entropy"),
        ("clip", "actor/pg_clipfrac"),
        ("t", "timing/step"),
        ("tok/s", "perf/tokens_per_s"),
    ]
    parts = [f"{name}={m[k]:.3g}" for name, k in keys if k in m]
    return f"step {step}: " + " ".join(parts)

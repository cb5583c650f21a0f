"""What a run's `rm:` reward models and `judge:` judges add to its memory per device
(`learner.plan`).

Resident for the whole run: each scorer's weights. A reward model is its `ValueModel` in
`RewardModelConfig.dtype`, in the training layout (`RewardModel` loads it so); a judge is a
`CausalLM` in `JudgeConfig.dtype` ('auto': the policy's compute dtype), in the sampling layout
(`rollout.judge` loads it so). The validation reward's scorers (`RLConfig.val_reward`) are
loaded beside the training reward's, so they count too.

Transient, while one scorer scores (the scoring phase: inside the rollout, after sampling,
with the sampler's weight copy still held; the scorers score one after another, so the
phase holds the largest of them):
- a reward model: one forward over `rows` packed rows of `length` tokens (`rows` =
  `RewardModelConfig.batch_size` or the step's sample count, whichever is smaller, rounded
  up to a power of two; `length` = the policy's sequence plus `TEMPLATE_MARGIN` tokens of the
  RM's own chat template, rounded up to a power of two, at most `max_length`'s). With the
  float32 attention scores of each causal query block of one layer (`models.self_attention`:
  blocks of `CAUSAL_BLOCK` queries; `M` the largest block, `S` all blocks of a layer, per
  device: rows over the batch axes, heads over `tensor`) and the fitted counts of
  `SCORING_COUNTS`:
      scoring = max(3.0*M, 2.1*S)*4 + 1.42*rows*length*D*a
  XLA:CPU keeps one block's scores, masked scores and probabilities at once, or, for long
  rows, several blocks' scores; the residual stream's embedding is held replicated. Fitted
  to XLA:CPU's memory analysis of the real `rewards.model` forward
  (`plan_check.xla_rm_forward_bytes`) on 60 configs (D 128 and 256, T 256 to 2048, 1 to 8
  rows, meshes 1x1x1, 1x2x2 and 2x2x1, float32 and bfloat16): worst error 26%. Rows under
  ~256 tokens of a tiny model are dominated by terms this leaves out (up to 50% under).
- a judge: its engine's paged KV pool (`max_slots` sequences of `max_prompt_length +
  max_new_tokens + 1` tokens, capped at the judge's context), exactly as the policy's
  (`plan_shapes.kv_pool_bytes`); the decode step's own temporaries are small beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxrl_llm.learner.plan_shapes import kv_pool_bytes, model_config, param_bytes, shard_numel
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.rules import SAMPLE_RULES, TRAIN_RULES

# Tokens the RM's chat template adds around a conversation (system prompt, role markers).
TEMPLATE_MARGIN = 64
SCORING_COUNTS = {
    "block": 3.0,  # float32 scores of the largest causal block: scores, masked, probabilities
    "blocks": 2.1,  # float32 scores of all blocks of one layer, when several are live
    "rows*D": 1.42,  # the residual stream's embedding, replicated over the mesh
}


@dataclasses.dataclass(frozen=True)
class ScorerLoad:
    """One on-device scorer of a run, in the numbers its memory depends on."""

    kind: str  # "rm" or "judge"
    checkpoint: str  # a folder, or a `SHAPES` name
    dtype: str  # weights and compute; a judge's may be 'auto'
    rows: int  # rm: packed rows per forward; judge: decode slots
    length: int  # rm: tokens per packed row; judge: tokens per sequence (prompt + verdict + 1)


def _bucket(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def scorer_loads(cfg: Any) -> tuple[ScorerLoad, ...]:
    """Every `rm:` and `judge:` scorer an `RLConfig` loads (its reward's, then its
    validation reward's), with each reward's own options applied."""
    from jaxrl_llm.rewards.config import device_reward_configs
    from jaxrl_llm.rewards.judge_config import judge_folder
    from jaxrl_llm.rewards.model_config import RewardModelConfig, model_folder

    rewards = [cfg.reward] + ([cfg.validation_reward()] if cfg.val_reward is not None else [])
    samples = cfg.data.prompts_per_step * cfg.rollout.n
    out = []
    for reward in rewards:
        for name, c in device_reward_configs(reward).items():
            if isinstance(c, RewardModelConfig):
                rows = min(_bucket(c.batch_size), _bucket(samples))
                length = min(_bucket(cfg.seq_len + TEMPLATE_MARGIN), _bucket(c.max_length))
                out.append(ScorerLoad("rm", str(model_folder(name)), c.dtype, rows, length))
            else:
                length = c.max_prompt_length + c.max_new_tokens + 1
                folder = str(judge_folder(name))
                out.append(ScorerLoad("judge", folder, c.dtype, c.max_slots, length))
    return tuple(out)


def scorer_config(load: ScorerLoad, compute_dtype: str):
    """The scorer's `ModelConfig`, in the dtype it loads in."""
    dtype = compute_dtype if load.dtype == "auto" else load.dtype
    try:
        return model_config(load.checkpoint, dtype=dtype, param_dtype=dtype)
    except ValueError as e:
        raise ValueError(f"reward '{load.kind}:{load.checkpoint}': {e}") from e


def scorer_bytes(load: ScorerLoad, mesh, compute_dtype: str) -> tuple[int, int]:
    """(resident, scoring) bytes per device of one scorer (the module docstring)."""
    from jaxrl_llm.models import ValueModel

    cfg = scorer_config(load, compute_dtype)
    if load.kind == "rm":
        weights = param_bytes(cfg, mesh, TRAIN_RULES, ValueModel)[0]
        return weights, rm_scoring_bytes(cfg, mesh, load.rows, load.length)
    length = min(load.length, cfg.max_position_embeddings)  # the judge caps its prompts
    weights = param_bytes(cfg, mesh, SAMPLE_RULES)[0]
    return weights, kv_pool_bytes(cfg, mesh, load.rows, length)


def rm_scoring_bytes(cfg, mesh, rows: int, length: int) -> int:
    """Peak activation bytes per device of a reward model's forward over [rows, length]."""
    from jaxrl_llm.models.self_attention import CAUSAL_BLOCK

    b = shard_numel((rows,), (ax.BATCH,), TRAIN_RULES, mesh)
    n = shard_numel((cfg.num_heads,), (ax.ACT_HEADS,), TRAIN_RULES, mesh)
    blocks = [
        b * n * min(CAUSAL_BLOCK, length - t0) * min(length, t0 + CAUSAL_BLOCK)
        for t0 in range(0, length, CAUSAL_BLOCK)
    ]
    c = SCORING_COUNTS
    scores = max(c["block"] * max(blocks), c["blocks"] * sum(blocks)) * 4
    residual = c["rows*D"] * rows * length * cfg.hidden_size * np.dtype(cfg.dtype).itemsize
    return int(scores + residual)


def scorers_memory(loads, mesh, compute_dtype: str) -> dict[str, int]:
    """The plan's terms: `reward_models` and `judges` (resident weights) and `scoring` (the
    largest scorer's transient bytes)."""
    terms = {"reward_models": 0, "judges": 0, "scoring": 0}
    for load in loads:
        resident, scoring = scorer_bytes(load, mesh, compute_dtype)
        terms["reward_models" if load.kind == "rm" else "judges"] += resident
        terms["scoring"] = max(terms["scoring"], scoring)
    return terms

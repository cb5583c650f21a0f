"""Tunix's GRPO step on the shape of `configs/bench_tunix_grpo.gin`, timed by phase: the
other side of `jaxrl-llm bench rl-step --gin_file bench_tunix_grpo.gin` (docs/performance.md,
"Against Tunix").

Tunix is not a dependency of this project: run this in a venv that has both,

    python -m venv /tmp/tunix && /tmp/tunix/bin/pip install google-tunix -e .
    /tmp/tunix/bin/python -m jaxrl_llm.bench.tunix_grpo [--steps 4]

What runs: the shipped tiny Qwen2 checkpoint loaded by Tunix's own safetensors loader as
actor and as reference, its `RLCluster` ('vanilla' rollout engine) and `GRPOLearner` with
its defaults (beta 0.04: a k3 KL loss to the reference; epsilon 0.2; one iteration), 8
prompts of the built-in arithmetic task a step (the training split, rendered by the
checkpoint's chat template), 8 samples each, at most 64 new tokens at temperature 1.0, AdamW
at 5e-5, one update on the whole batch, rewarded by this project's `math` reward. Each
phase is Tunix's own call, timed from outside with its outputs waited on: `rollout`
(`RLCluster.generate`), `reference` (`get_ref_per_token_logps`), `update`
(`update_actor`, its parameters waited on); `total` is the whole step (from one step's
generate to the next's, the last to the end of training). Step 1 compiles; `phases_s`
holds the medians of the others. Prints one JSON object, with the host (`bench.machine`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

PROMPTS, SAMPLES, NEW_TOKENS, PROMPT_LENGTH = 8, 8, 64, 128


def _tunix_config(hf: dict[str, Any]):
    from tunix.models.qwen2 import model as qwen2

    return qwen2.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"],
        head_dim=hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"]),
        num_kv_heads=hf["num_key_value_heads"], rope_theta=int(hf["rope_theta"]),
        norm_eps=hf["rms_norm_eps"], use_tied_embedding=hf.get("tie_word_embeddings", False),
    )  # fmt: skip


def _batches(tokenizer, steps: int):
    from jaxrl_llm.data.tasks.arithmetic import generate_problems
    from jaxrl_llm.data.templates import render_prompt

    rows = generate_problems(PROMPTS * steps, seed=0, split="train")
    for i in range(steps):
        chunk = rows[i * PROMPTS : (i + 1) * PROMPTS]
        yield {  # as a Grain batch holds them: arrays of strings
            "prompts": np.array([render_prompt(r, "chat", tokenizer=tokenizer) for r in chunk]),
            "answer": np.array([r["answer"] for r in chunk]),
        }


def _reward(prompts, completions, answer, **_):
    from jaxrl_llm.rewards.registry import resolve_reward

    math, gets = resolve_reward("math")  # gets: the ground truth's form, an answer or a row
    truth = (lambda a: a) if gets == "answer" else (lambda a: {"answer": a})
    return [float(math(c, truth(a))) for c, a in zip(completions, answer, strict=True)]


class _Timer:
    """Wraps a cluster's calls: each call's seconds (its outputs waited on) by phase."""

    def __init__(self, cluster, model):
        import jax

        self.calls: dict[str, list[float]] = {"rollout": [], "reference": [], "update": []}
        self.starts: list[float] = []
        names = {"generate": "rollout", "get_ref_per_token_logps": "reference",
                 "update_actor": "update"}  # fmt: skip
        for method, phase in names.items():
            inner = getattr(cluster, method)

            def timed(*a, _inner=inner, _phase=phase, **k):
                t0 = time.perf_counter()
                if _phase == "rollout":
                    self.starts.append(t0)
                out = _inner(*a, **k)
                jax.block_until_ready(out if _phase != "update" else _params(model))
                self.calls[_phase].append(time.perf_counter() - t0)
                return out

            setattr(cluster, method, timed)


def _params(model):
    from flax import nnx

    return nnx.state(model)


def run(steps: int) -> dict[str, Any]:
    import jax
    import optax
    from transformers import AutoTokenizer
    from tunix.models.qwen2 import params as qwen2_params
    from tunix.rl import rl_cluster as rl
    from tunix.rl.grpo import grpo_learner as grpo
    from tunix.rl.rollout import base_rollout

    from jaxrl_llm.assets import resolve_checkpoint
    from jaxrl_llm.bench.machine import host
    from jaxrl_llm.models import read_config

    path = str(resolve_checkpoint("builtin"))
    cfg = _tunix_config(read_config(path))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    actor = qwen2_params.create_model_from_safe_tensors(path, cfg, mesh)
    reference = qwen2_params.create_model_from_safe_tensors(path, cfg, mesh)
    tokenizer = AutoTokenizer.from_pretrained(path)
    cluster = rl.RLCluster(
        actor=actor, reference=reference, tokenizer=tokenizer,
        cluster_config=rl.ClusterConfig(
            role_to_mesh={rl.Role.ACTOR: mesh, rl.Role.REFERENCE: mesh, rl.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=rl.RLTrainingConfig(
                actor_optimizer=optax.adamw(5e-5), eval_every_n_steps=10_000, max_steps=steps,
            ),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=NEW_TOKENS, max_prompt_length=PROMPT_LENGTH,
                kv_cache_size=PROMPT_LENGTH + NEW_TOKENS + 64, temperature=1.0, top_p=1.0,
            ),
        ),
    )  # fmt: skip
    timer = _Timer(cluster, actor)
    learner = grpo.GRPOLearner(
        rl_cluster=cluster, algo_config=grpo.GRPOConfig(num_generations=SAMPLES),
        reward_fns=_reward,
    )  # fmt: skip
    t0 = time.perf_counter()
    learner.train(list(_batches(tokenizer, steps)))
    jax.block_until_ready(_params(actor))
    end = time.perf_counter()
    ends = [*timer.starts[1:], end]
    per_step = [
        {"step": i + 1, "total": e - s, **{k: v[i] for k, v in timer.calls.items() if i < len(v)}}
        for i, (s, e) in enumerate(zip(timer.starts, ends, strict=True))
    ]
    timed = per_step[1:] or per_step
    keys = ("rollout", "reference", "update", "total")
    return {
        "suite": "tunix-grpo",
        "shape": {"prompts": PROMPTS, "samples": SAMPLES, "new_tokens": NEW_TOKENS},
        "phases_s": {k: statistics.median(s[k] for s in timed if k in s) for k in keys},
        "per_step": per_step,
        "run_wall_s": end - t0,
        "host": host(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.steps), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

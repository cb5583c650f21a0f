"""LoRA in the rollout: decode with unmerged adapters vs merged weights, and the merge's cost.

    python -m jaxrl_llm.bench.lora_rollout --checkpoint qwen2.5-0.5b [--rank 16]

Prints one JSON line: the paged engine's greedy decode milliseconds per step for the plain
model, the model with rank-r adapters on every projection (unmerged: the adapter term runs
in each projection, `models.lora.dense`), and the same model merged (W + (alpha/r) A B),
plus the seconds of one jitted merge of every adapted weight: what merging once per weight
sync would add to each RL step, besides a second full copy of the weights for the rollout.
docs/lora.md has the readings and the choice they led to (unmerged).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def decode_ms(model, batch: int, prompt: int, new: int, steps: int, repeats: int) -> float:
    """Best-of-`repeats` greedy decode milliseconds per step (`bench.rollout`'s timing)."""
    from jaxrl_llm.bench.rollout import timed_greedy_decode

    _, (_, decode_s) = timed_greedy_decode(model, batch, prompt, new, steps, repeats)
    return 1e3 * decode_s / new


def merge_seconds(model) -> float:
    """Seconds of one jitted merge of every adapter into its weight (after compiling)."""
    import jax
    from flax import nnx

    from jaxrl_llm.models.lora import merge_adapters

    graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
    merge = jax.jit(lambda a, r: nnx.state(merge_adapters(nnx.merge(graphdef, a, r))))
    jax.block_until_ready(merge(adapters, rest))
    t0 = time.perf_counter()
    jax.block_until_ready(merge(adapters, rest))
    return time.perf_counter() - t0


def run(checkpoint: str, rank: int, batch: int, prompt: int, new: int, repeats: int) -> dict:
    import jax

    from jaxrl_llm.bench.machine import bench_checkpoint
    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.models.lora import LoraConfig, adapters, apply_lora, merge_adapters

    shape = dict(batch=batch, prompt=prompt, new=new, steps=8, repeats=repeats)
    with tempfile.TemporaryDirectory() as tmp:
        model = from_pretrained(bench_checkpoint(checkpoint, Path(tmp)))
    plain = decode_ms(model, **shape)
    apply_lora(model, LoraConfig(rank=rank, alpha=2.0 * rank), seed=0)
    key = jax.random.key(1)
    for ad in adapters(model):  # trained-looking adapters: B away from zero
        key, sub = jax.random.split(key)
        var = getattr(ad.module, ad.name + "_lora_b")
        var.set_value(0.01 * jax.random.normal(sub, var.shape, var.get_value().dtype))
    unmerged = decode_ms(model, **shape)
    merge_s = merge_seconds(model)
    merged = decode_ms(merge_adapters(model), **shape)
    return {
        "checkpoint": checkpoint,
        "rank": rank,
        **shape,
        "plain_ms_per_step": plain,
        "unmerged_ms_per_step": unmerged,
        "merged_ms_per_step": merged,
        "merge_s": merge_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="LoRA rollout: unmerged vs merged decode")
    parser.add_argument("--checkpoint", default="qwen2.5-0.5b")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args(argv)
    print(json.dumps(run(a.checkpoint, a.rank, a.batch, a.prompt, a.new_tokens, a.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

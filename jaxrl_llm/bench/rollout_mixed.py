"""`jaxrl-llm bench rollout --mixed`: a rollout shaped like ToRL's, where lengths differ.

`--prompts` prompts (default 8) of 512 random tokens, n = 8 samples each, every sample with
its own budget drawn uniformly from [64, 2048] new tokens (EOS off, so it runs to its
budget). All samples decode together (the pool holds them all), samples of a prompt share
its full pages. Reports tokens/s, ms per decode step, and the KV bytes the decode attention
read per generated token next to the tokens actually in context per generated token (what
a cache reading only what is in use would read) and next to a dense cache's (every slot x
the full cache length). No HF baseline: `generate` cannot give samples their own lengths.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxrl_llm.bench.kv import kv_bytes_read, kv_fields
from jaxrl_llm.bench.machine import bench_checkpoint, machine_ceilings

PROMPT, N_SAMPLES, LOW, HIGH = 512, 8, 64, 2048


def run(path: Path, prompts: int, steps: int, seed: int = 0, kv: str = "auto") -> dict:
    import jax

    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.rollout.engine import Engine
    from jaxrl_llm.rollout.sampling import SamplingParams, SlotSampling

    model = from_pretrained(path)
    B, S = prompts * N_SAMPLES, PROMPT + HIGH + 1
    engine = Engine(model, max_concurrent_decodes=B, max_cache_length=S,
                    max_prefill_length=PROMPT, eos_ids=(),
                    kv_dtype=None if kv == "auto" else kv)  # fmt: skip
    params = engine.load_params()
    rng = np.random.RandomState(seed)
    tokens = rng.randint(3, model.config.vocab_size, (prompts, PROMPT)).astype(np.int32)
    budgets = rng.randint(LOW, HIGH + 1, B)
    greedy = SlotSampling.one(SamplingParams(temperature=0.0), 0)
    best = None
    for _ in range(2):  # the first run compiles
        state = engine.init_decode_state()
        t0 = time.perf_counter()
        prefix = engine.prefill_many(params, list(tokens))
        for p in range(prompts):
            for i in range(N_SAMPLES):
                b = p * N_SAMPLES + i
                state = engine.insert_slot(prefix, state, b, greedy, int(budgets[b]), row=p)
        held = engine.num_pages - engine.pages.num_free
        jax.block_until_ready(state)
        t1 = time.perf_counter()
        for _ in range(-(-HIGH // steps)):
            state, rec = engine.generate_steps(params, state, steps)
        jax.block_until_ready(rec)
        t2 = time.perf_counter()
        best = (t1 - t0, t2 - t1) if best is None or t2 - t0 < sum(best) else best
        for b in range(B):
            engine.release_slot(b)
    generated = int(budgets.sum())
    # Row b holds PROMPT + t + 1 tokens at step t while t < its budget, then nothing.
    lens = [np.where(t < budgets, PROMPT + t + 1, 0) for t in range(HIGH)]
    in_context = sum(int(x.sum()) for x in lens) * engine.kv_bytes_per_token()
    read = kv_bytes_read(engine, lens)
    dense = B * S * HIGH * engine.kv_bytes_per_token()
    prefill_s, decode_s = best
    return {
        **kv_fields(engine, held),
        "samples": B,
        "generated_tokens": generated,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "tokens_per_s": generated / (prefill_s + decode_s),
        "ms_per_decode_step": 1e3 * decode_s / HIGH,
        "kv_bytes_read_per_token": read / generated,
        "kv_bytes_in_context_per_token": in_context / generated,
        "kv_read_over_in_context": read / in_context,
        "dense_cache_read_over_in_context": dense / in_context,
    }


def main(args: argparse.Namespace) -> int:
    from jaxrl_llm.bench.rollout import sampler_settings

    prompts = args.prompts
    _, kv = sampler_settings(args)
    other = None
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_checkpoint(args.checkpoint, Path(tmp))
        result = run(path, prompts, args.steps_per_call)
        if kv != "auto":  # the same run with the other KV cache, e.g. int8
            other = run(path, prompts, args.steps_per_call, kv=kv)
    out = {"suite": "rollout-mixed", "checkpoint": args.checkpoint, "prompts": prompts,
           "prompt_len": PROMPT, "n": N_SAMPLES, "new_tokens_range": [LOW, HIGH],
           "engine": result, "kv_cache_dtype": kv, "engine_kv": other,
           **({"kv_speedup": other["tokens_per_s"] / result["tokens_per_s"]} if other else {}),
           "ceilings": machine_ceilings()}  # fmt: skip
    print(json.dumps(out, indent=1))
    return 0

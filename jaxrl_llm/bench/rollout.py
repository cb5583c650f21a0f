"""`jaxrl-llm bench rollout`: prefill and decode tokens/s of our engine vs HF `generate`
(and vLLM with `--backend vllm`, `bench/vllm_rollout.py`).

Same checkpoint, batch, prompt length and number of new tokens for both, measured in the
same run, with the machine's ceilings (float32 matmul FLOP/s, streaming read bytes/s), so the
output reads as ratios and roofline fractions. Greedy decoding with EOS disabled, so every
row produces exactly `--new-tokens` tokens. Prompts are random token ids.

`--gin_param 'RolloutConfig.weights="int8"'` (or `"w8a8"`) also measures the engine with
int8 projections (`models.quant.int8_projections`, what the RL sampler holds with that
setting) in the same run: its tokens/s beside the float engine's and its roofline fraction
of the bytes it reads.

The roofline fractions divide the bytes a decode step reads by the read bandwidth of the same
run: the weights (`decode_weight_bytes_per_step`: every stored weight, but of an untied input
embedding only the B rows gathered), then with the KV cache the step reads as well.

`--checkpoint` is a directory, 'builtin' (the shipped tiny model) or a shape
name from `models.presets.PRESETS` (random weights, written once to a temporary HF
checkpoint that both sides load).
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


def timed_greedy_decode(
    model, B: int, P: int, N: int, steps: int, repeats: int, kv: str = "auto"
):  # fmt: skip
    """(engine, (prefill s, decode s)) of the best of `repeats` greedy runs of `model` in
    the paged engine (KV cache `kv`: `RolloutConfig.kv_cache_dtype`): B random P-token
    prompts, N new tokens each, `steps` per call (the first run compiles and is not
    counted)."""
    engine, params, start = _greedy_decode(model, B, P, N, kv)
    return engine, _best_decode(engine, params, start, N, steps, repeats)


def _best_decode(engine, params, start, N: int, steps: int, repeats: int):
    import jax

    best = (float("inf"), float("inf"))
    for _ in range(repeats + 1):  # the first run compiles
        state = engine.init_decode_state()
        t0 = time.perf_counter()
        state = start(state)
        jax.block_until_ready(state)
        t1 = time.perf_counter()
        for _ in range(-(-N // steps)):
            state, _ = engine.generate_steps(params, state, steps)
        jax.block_until_ready(state)
        t2 = time.perf_counter()
        run = (t1 - t0, t2 - t1)
        best = run if sum(run) < sum(best) else best
    return best


def _greedy_decode(model, B: int, P: int, N: int, kv: str):
    """(engine, params, start): `start(state)` prefills B random P-token prompts in one batch
    and inserts them into the decode state, greedy with N new tokens each."""
    from jaxrl_llm.rollout.engine import Engine
    from jaxrl_llm.rollout.sampling import SamplingParams, SlotSampling

    engine = Engine(model, max_concurrent_decodes=B, max_cache_length=P + N + 1,
                    max_prefill_length=P, eos_ids=(),
                    kv_dtype=None if kv == "auto" else kv)  # fmt: skip
    params = engine.load_params()
    V = model.config.vocab_size
    prompts = np.random.RandomState(0).randint(3, V, (B, P)).astype(np.int32)
    greedy = SlotSampling.one(SamplingParams(temperature=0.0), 0)

    def start(state):
        prefix = engine.prefill_many(params, list(prompts))  # one batched prefill
        for b in range(B):
            state = engine.insert_slot(prefix, state, b, greedy, N, row=b)
        return state

    return engine, params, start


def profile_decode(engine, params, start, steps: int) -> dict:
    """One call of `steps` decode steps traced op by op (`bench.op_profile`): the op time
    by kind and source function, and the ops executed per decode step (on an accelerator,
    kernels: at small batches their count, not the bytes, can bound a step)."""
    from jaxrl_llm.bench.op_profile import profile_call

    fn = engine._steps_fn(steps)
    prof = profile_call(fn, engine.place_params(params), start(engine.init_decode_state()))
    return {**prof.to_json(), "ops_per_step": prof.op_events / steps}


def decode_weight_bytes_per_step(model, batch: int) -> int:
    """Weight bytes one decode step of `batch` rows reads: every stored weight once (int8
    ones with their scales), except an untied input embedding [V, D], of which the step
    gathers only its `batch` rows; a tied one is the LM head as well, read whole, and its
    `batch` rows besides.

        bytes = param_bytes - (0 if tied else table) + batch * table / V

    with table the embedding's bytes (and its int8 row scales: one per row)."""
    import jax
    from flax import nnx

    from jaxrl_llm.models.quant import SCALE_SUFFIX

    decoder = model.model
    names = ("embed_tokens", "embed_tokens" + SCALE_SUFFIX)
    table = sum(getattr(decoder, n)[...].nbytes for n in names if hasattr(decoder, n))
    stored = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    untied = 0 if model.config.tie_word_embeddings else table
    return int(stored - untied + batch * table // model.config.vocab_size)


def bench_engine(
    path: Path, B: int, P: int, N: int, steps: int, repeats: int, weights: str = "same",
    kv: str = "auto", profile: bool = False,
) -> dict:  # fmt: skip
    import jax
    from flax import nnx

    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.models.quant import int8_projections

    model = from_pretrained(path)
    sync = None
    if weights != "same":
        sync = sync_seconds(nnx.state(model))
        int8_projections(model, activations=weights == "w8a8")
    engine, params, start = _greedy_decode(model, B, P, N, kv)
    best = _best_decode(engine, params, start, N, steps, repeats)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    step_bytes = decode_weight_bytes_per_step(model, B)
    prefill_s, decode_s = best
    kv_read = kv_bytes_read(engine, [np.full(B, P + t + 1) for t in range(N)])
    return {
        **kv_fields(engine, engine.num_pages - engine.pages.num_free),
        "ms_per_decode_step": 1e3 * decode_s / N,
        "decode_kv_bytes_read": kv_read,
        "decode_bytes_per_s": (step_bytes * N + kv_read) / decode_s,
        "params": int(n_params),
        "param_bytes": int(param_bytes),
        "decode_weight_bytes_per_step": step_bytes,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "prefill_tokens_per_s": B * P / prefill_s,
        "decode_tokens_per_s": B * N / decode_s,
        "tokens_per_s": B * N / (prefill_s + decode_s),
        "decode_weight_bytes_per_s": step_bytes * N / decode_s,
        **({"weight_sync_s": sync} if sync else {}),
        **({"profile": profile_decode(engine, params, start, steps)} if profile else {}),
    }


def sync_seconds(state, repeats: int = 5) -> dict:
    """Best-of-`repeats` seconds of the sampler sync's program on `state` (a float policy
    State) three ways: a plain copy (what a re-layout writes), the bfloat16 cast
    (`PolicyConfig.rollout_dtype`) and the int8 quantisation (`RolloutConfig.weights`)."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.models.quant import quantize_projections

    programs = {
        "copy": lambda p: jax.tree.map(jnp.copy, p),
        "cast_bfloat16": lambda p: jax.tree.map(lambda x: x.astype(jnp.bfloat16), p),
        "quantise_int8": quantize_projections,
    }
    out = {}
    for name, fn in programs.items():
        fn = jax.jit(fn)
        jax.block_until_ready(fn(state))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(state))
            best = min(best, time.perf_counter() - t0)
        out[name] = best
    out["quantise_over_copy"] = out["quantise_int8"] / out["copy"]
    return out


def _quantised_fields(ours: dict, q: dict, ceilings: dict) -> dict:
    """The int8 engine against the float one of the same run: decode speedup, the bytes
    ratio that bounds it, and its own roofline fractions (weights; weights + KV)."""
    read = ceilings["read_bytes_per_s"]
    return {
        "quantised_decode_speedup": q["decode_tokens_per_s"] / ours["decode_tokens_per_s"],
        "quantised_weight_bytes_ratio": (
            ours["decode_weight_bytes_per_step"] / q["decode_weight_bytes_per_step"]
        ),
        "quantised_decode_bandwidth_roofline_fraction": q["decode_weight_bytes_per_s"] / read,
        "quantised_decode_bandwidth_roofline_fraction_with_kv": q["decode_bytes_per_s"] / read,
    }


def bench_hf(path: Path, B: int, P: int, N: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    V = model.config.vocab_size
    ids = torch.from_numpy(np.random.RandomState(0).randint(3, V, (B, P)).astype(np.int64))
    kwargs = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)  # pyright: ignore[reportAttributeAccessIssue]  # transformers' stub
            best = min(best, time.perf_counter() - t0)
    return {"total_s": best, "tokens_per_s": B * N / best, "torch_threads": torch.get_num_threads()}


def sampler_settings(args: argparse.Namespace) -> tuple[str, str]:
    """(`RolloutConfig.weights`, `RolloutConfig.kv_cache_dtype`) as `--gin_file` /
    `--gin_param` set them ('same', 'auto' by default)."""
    from jaxrl_llm.config import parse_gin
    from jaxrl_llm.rollout.config import RolloutConfig

    parse_gin(args.gin_file or [], args.gin_param)
    cfg = RolloutConfig()
    return cfg.weights, cfg.kv_cache_dtype


def main(args: argparse.Namespace) -> int:
    B, P, N = args.batch, args.prompt_len, args.new_tokens
    weights, kv = sampler_settings(args)
    quantised = None
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_checkpoint(args.checkpoint, Path(tmp))
        steps, repeats, profile = args.steps_per_call, args.repeats, args.profile
        ours = bench_engine(path, B, P, N, steps, repeats, profile=profile)
        if weights != "same" or kv != "auto":
            quantised = bench_engine(path, B, P, N, steps, repeats, weights, kv, profile)
        hf = None if args.skip_hf else bench_hf(path, B, P, N, args.repeats)
        vllm = None
        if args.backend == "vllm":
            from jaxrl_llm.bench.vllm_rollout import bench_vllm

            vllm = bench_vllm(path, B, P, N, args.repeats)
    ceilings = machine_ceilings()
    result = {
        "suite": "rollout",
        "checkpoint": args.checkpoint,
        "batch": B,
        "prompt_len": P,
        "new_tokens": N,
        "engine": ours,
        "hf_generate": hf,
        "vllm": vllm,
        "sampler_weights": weights,
        "kv_cache_dtype": kv,
        "engine_quantised": quantised,
        "ceilings": ceilings,
        "speedup_vs_hf": None if hf is None else ours["tokens_per_s"] / hf["tokens_per_s"],
        "speedup_vs_vllm": None if vllm is None else ours["tokens_per_s"] / vllm["tokens_per_s"],
        "decode_bandwidth_roofline_fraction": (
            ours["decode_weight_bytes_per_s"] / ceilings["read_bytes_per_s"]
        ),
        "decode_bandwidth_roofline_fraction_with_kv": (
            ours["decode_bytes_per_s"] / ceilings["read_bytes_per_s"]
        ),
        **(_quantised_fields(ours, quantised, ceilings) if quantised else {}),
    }
    print(json.dumps(result, indent=1))
    return 0

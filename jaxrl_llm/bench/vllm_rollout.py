"""`jaxrl-llm bench rollout --backend vllm`: vLLM's greedy tokens/s beside our engine's.

The same checkpoint folder, batch, prompt length and new tokens as the engine's measurement
in the same run (`bench/rollout.py`): B random P-token prompts, N new tokens each (EOS
ignored, so every row decodes exactly N), greedy, float32 on CPU (`VllmConfig.dtype`'s
"auto"). Prefix caching off: the prompts are random and every request would miss. The
best of `repeats` runs after one warm-up run; vLLM's own time to start is reported apart,
and so is one RL weight push (`vllm_engine.load_weights`: the checkpoint's weights, loaded
by our loader, into vLLM in memory; the best of `repeats`), the cost each step adds.
"""

from __future__ import annotations

import time
from pathlib import Path


def bench_vllm(path: Path, B: int, P: int, N: int, repeats: int) -> dict:
    """{'tokens_per_s', 'total_s', 'start_s', 'weight_push_s', 'weight_push_bytes',
    'version', 'dtype'} of vLLM on `path`."""
    import numpy as np

    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.rollout.config import VllmConfig
    from jaxrl_llm.rollout.vllm_engine import cpu_engine_args, import_vllm, load_weights, new_llm

    vllm = import_vllm()
    from vllm.platforms import current_platform

    dtype = "float32" if current_platform.is_cpu() else "bfloat16"
    t0 = time.perf_counter()
    cpu_args = cpu_engine_args(VllmConfig(), P + N + 1) if current_platform.is_cpu() else {}
    llm = new_llm(vllm, model=str(path), dtype=dtype, seed=0, max_model_len=P + N + 1,
                   max_num_seqs=max(B, 1), enable_prefix_caching=False,
                   skip_tokenizer_init=True, **cpu_args)  # fmt: skip
    start_s = time.perf_counter() - t0
    V = llm.llm_engine.vllm_config.model_config.hf_config.vocab_size
    ids = np.random.RandomState(0).randint(3, V, (B, P)).tolist()
    prompts = [{"prompt_token_ids": row} for row in ids]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=N, min_tokens=N, ignore_eos=True,
                                 detokenize=False)  # fmt: skip
    best = float("inf")
    try:
        for _ in range(repeats + 1):  # the first run warms up
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            best = min(best, time.perf_counter() - t0)
            assert all(len(o.outputs[0].token_ids) == N for o in outs)
        model = from_pretrained(path)
        pushes = [load_weights(llm, model, dtype) for _ in range(repeats + 1)][1:]
    finally:
        llm.llm_engine.engine_core.shutdown()
    return {"total_s": best, "tokens_per_s": B * N / best, "start_s": start_s,
            "weight_push_s": min(p.seconds for p in pushes),
            "weight_push_bytes": pushes[0].bytes,
            "version": vllm.__version__, "dtype": dtype}  # fmt: skip

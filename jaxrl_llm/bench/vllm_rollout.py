"""`jaxrl-llm bench rollout --backend vllm`: vLLM's greedy tokens/s beside our engine's.

The same checkpoint folder, batch, prompt length and new tokens as the engine's measurement
in the same run (`bench/rollout.py`): B random P-token prompts, N new tokens each (EOS
ignored, so every row decodes exactly N), greedy, float32 on CPU (`VllmConfig.dtype`'s
"auto"). Prefix caching off: the prompts are random and every request would miss. The
best of `repeats` runs after one warm-up run; vLLM's own time to start is reported apart.
"""

from __future__ import annotations

import time
from pathlib import Path


def bench_vllm(path: Path, B: int, P: int, N: int, repeats: int) -> dict:
    """{'tokens_per_s', 'total_s', 'start_s', 'version', 'dtype'} of vLLM on `path`."""
    import numpy as np

    from jaxrl_llm.rollout.vllm_sampler import import_vllm

    vllm = import_vllm()
    from vllm.platforms import current_platform

    dtype = "float32" if current_platform.is_cpu() else "bfloat16"
    t0 = time.perf_counter()
    llm = vllm.LLM(model=str(path), dtype=dtype, seed=0, max_model_len=P + N + 1,
                   max_num_seqs=max(B, 1), enable_prefix_caching=False)  # fmt: skip
    start_s = time.perf_counter() - t0
    V = llm.llm_engine.vllm_config.model_config.hf_config.vocab_size
    ids = np.random.RandomState(0).randint(3, V, (B, P)).tolist()
    prompts = [{"prompt_token_ids": row} for row in ids]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=N, min_tokens=N, ignore_eos=True)
    best = float("inf")
    try:
        for _ in range(repeats + 1):  # the first run warms up
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            best = min(best, time.perf_counter() - t0)
            assert all(len(o.outputs[0].token_ids) == N for o in outs)
    finally:
        llm.llm_engine.engine_core.shutdown()
    return {"total_s": best, "tokens_per_s": B * N / best, "start_s": start_s,
            "version": vllm.__version__, "dtype": dtype}  # fmt: skip

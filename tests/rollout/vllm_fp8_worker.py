"""Run by `test_vllm_backend.py::test_an_fp8_kv_cache_reaches_vllm` in its own process:
a vLLM sampler with an fp8 KV cache samples the module's prompts and prints the largest
distance of its sampled logprobs from the float64 forward's, as JSON.

Its own process because vLLM's distributed state (its parallel groups) is one per process:
closing a second in-process vLLM tears down the groups the test module's vLLM still uses."""

import json
import sys

import numba  # noqa: F401  vLLM must start with numba loaded (`vllm_engine.new_llm`)
import numpy as np
from flax import nnx

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import from_pretrained, load_tokenizer
from jaxrl_llm.rollout.config import RolloutConfig, VllmConfig
from jaxrl_llm.rollout.sampler import SamplerContext
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.rollout.vllm_sampler import VllmSampler
from tests.rollout.reference import exact_logprobs


def main(kv_cache_dtype: str, max_prompt: int, prompts: list[str]) -> None:
    path = builtin_checkpoint()
    model, tok = from_pretrained(path), load_tokenizer(path)
    cfg = RolloutConfig(max_new_tokens=128, max_slots=8, backend="vllm")
    ctx = SamplerContext(cfg=cfg, policy=model, tokenizer=tok, mesh=None, checkpoint=path,
                         max_prompt_length=max_prompt)  # fmt: skip
    sampler = VllmSampler(ctx, VllmConfig(enforce_eager=True, kv_cache_dtype=kv_cache_dtype))
    try:
        sampler.push_weights(nnx.state(model))
        ids = [np.asarray(tok(t)["input_ids"], np.int32) for t in prompts]
        got = sampler.generate(ids, SamplingParams(temperature=1.0, max_new_tokens=24, n=2, seed=3))
        logprobs = np.concatenate([c.logprobs for c in got])
        error = float(np.abs(logprobs - exact_logprobs(model, got)).max())
    finally:
        sampler.close()
    print(json.dumps({"max_error": error}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]))

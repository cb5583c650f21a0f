"""LoRA weight pushes to vLLM leave the trainer's weights alone: a push merges the adapters
into whole weights for vLLM (`vllm_engine.load_weights`), and the trainer's frozen base and
its KL reference (the same base, adapters off) share Variables with what is pushed
(`learner.lora.full_params`: no copy). After every push they are unchanged bit for bit, and
vLLM samples from the policy (base + adapters, once), as the trainer computes it."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.learner.lora import full_params, split_trainable
from jaxrl_llm.learner.overlap import _copy
from jaxrl_llm.models import from_pretrained, load_tokenizer
from jaxrl_llm.models.lora import LoraConfig, merge_adapters
from jaxrl_llm.rollout.config import RolloutConfig, VllmConfig
from jaxrl_llm.rollout.sampler import SamplerContext
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.rollout.vllm_sampler import VllmSampler
from jaxrl_llm.testing import assert_as_accurate, float64_twin, randomise_lora_b
from tests.rollout.test_vllm_backend import PROMPT_TEXTS, _trainer_logprobs

pytestmark = pytest.mark.slow


@dataclasses.dataclass
class LoraRun:
    graphdef: nnx.GraphDef
    params: nnx.State
    frozen: nnx.State
    ref: nnx.State
    sampler: VllmSampler
    prompts: list[np.ndarray]


@pytest.fixture(scope="module")
def run():
    path = builtin_checkpoint()
    policy, tok = from_pretrained(path), load_tokenizer(path)
    graphdef, params, frozen, ref = split_trainable(
        policy, LoraConfig(rank=4), seed=0, reference=True
    )
    assert frozen is not None and ref is not None
    randomise_lora_b(nnx.merge(graphdef, params, frozen))  # trained adapters (params' B)
    cfg = RolloutConfig(max_new_tokens=24, max_slots=4, backend="vllm")
    ctx = SamplerContext(
        cfg=cfg, policy=policy, tokenizer=tok, mesh=None, checkpoint=path, max_prompt_length=64
    )
    import numba  # noqa: F401  vLLM must start with numba loaded (`vllm_engine.new_llm`)

    sampler = VllmSampler(ctx, VllmConfig(enforce_eager=True))
    prompts = [np.asarray(tok(t)["input_ids"], np.int32) for t in PROMPT_TEXTS]
    yield LoraRun(graphdef, params, frozen, ref, sampler, prompts)
    sampler.close()


def _values(state: nnx.State) -> dict[str, np.ndarray]:
    return {"/".join(map(str, p)): np.array(v.get_value()) for p, v in nnx.to_flat_state(state)}


def test_pushes_leave_the_base_and_the_reference_untouched(run):
    frozen0, ref0 = _values(run.frozen), _values(run.ref)
    # The policy as the trainer computes it (base + (alpha / r) x A B, unmerged), own arrays.
    policy = nnx.clone(nnx.merge(run.graphdef, run.params, run.frozen), arrays=True)
    merged = merge_adapters(policy)  # whole float32 weights, as a push sends them
    with jax.enable_x64(True):
        twin = float64_twin(merged)
    pushes = {
        1: lambda: full_params(run.params, run.frozen),  # the synchronous loop's push
        2: lambda: full_params(run.params, run.frozen),  # again: nothing may accumulate
        # as `max_staleness`'s producer publishes: trained params copied, frozen base shared
        3: lambda: full_params(_copy(run.params), run.frozen),
    }
    for version, weights in pushes.items():
        run.sampler.push_weights(weights(), version=version)
        for name, now, before in (("frozen", run.frozen, frozen0), ("ref", run.ref, ref0)):
            for key, value in _values(now).items():
                np.testing.assert_array_equal(value, before[key], err_msg=f"{name} {key}")
        sp = SamplingParams(temperature=1.0, max_new_tokens=16, seed=version)
        for c in run.sampler.generate(run.prompts, sp):
            # vLLM computes with the merged float32 weights: so does the trusted program
            # (JAX, float32) and, in float64, the exact one (`assert_as_accurate`). A base
            # merged twice or more is off by whole nats.
            want = _trainer_logprobs(merged, nnx.state(merged), c, 1.0)
            with jax.enable_x64(True):
                exact = _trainer_logprobs(twin, nnx.state(twin), c, 1.0)
            worst = assert_as_accurate({"lp": c.logprobs}, {"lp": want}, {"lp": exact})
            print(f"push {version}: vLLM logprob error / bound {worst:.2f}")

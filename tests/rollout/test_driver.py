"""The RL rollout driver: continuous batching, n samples, stops, tool turns, buckets."""

import jax
import numpy as np
import pytest

from jaxrl_llm.rollout import RolloutDriver, SamplingParams, pad_completions
from jaxrl_llm.testing import assert_as_accurate, float64_twin
from tests.rollout.reference import exact_logprobs, full_logits, naive_greedy

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)
RNG = np.random.RandomState(0)
MIXED = [list(RNG.randint(6, 128, n)) for n in (3, 11, 7, 1, 20, 5)]


@pytest.mark.slow  # 31 s in a loaded 2-worker run, AMD EPYC AVX2
def test_greedy_equals_full_recompute_with_refill(tiny_model, tiny_engine):
    """6 prompts of mixed lengths through 4 slots (refilled as samples finish)."""
    budgets = [3, 10, 6, 10, 2, 8]
    sps = [SamplingParams(temperature=0.0, max_new_tokens=m) for m in budgets]
    driver = RolloutDriver(tiny_engine, steps_per_call=4)
    out = driver.generate(MIXED, sps)
    assert driver.stats["inserts"] == 6 and driver.stats["prefills"] < 6  # batched prefills
    for c, p, m in zip(out, MIXED, budgets):
        ref = naive_greedy(tiny_model, p, m, eos=(5,))
        np.testing.assert_array_equal(c.token_ids, ref)
        assert c.finish_reason == ("eos" if ref[-1] == 5 else "length")
        np.testing.assert_array_equal(c.response_mask, 1)
    # Continuous batching gives what each prompt gets alone.
    alone = [driver.generate([p], sp)[0] for p, sp in zip(MIXED[:2], sps[:2])]
    for a, c in zip(alone, out):
        np.testing.assert_array_equal(a.token_ids, c.token_ids)


@pytest.mark.slow  # 17 s in a loaded 2-worker run, AMD EPYC AVX2
def test_n_samples_one_prefill_seeded(tiny_model, tiny_engine):
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, n=3, seed=5)
    driver = RolloutDriver(tiny_engine, steps_per_call=8)
    out = driver.generate(MIXED[:3], sp)
    assert driver.stats["prefills"] <= 3 and driver.stats["inserts"] == 9  # prompts batched
    assert [(c.prompt_index, c.sample_index) for c in out] == [
        (i, j) for i in range(3) for j in range(3)
    ]
    assert len({tuple(c.token_ids) for c in out[:3]}) > 1  # samples of one prompt differ
    # Same seed -> same samples, whatever the slot count or the steps per call.
    again = RolloutDriver(tiny_engine, steps_per_call=4).generate(MIXED[:3], sp)
    for a, b in zip(out, again):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
    logprobs = lambda samples: np.concatenate([c.logprobs for c in samples])
    # trusted: 8 steps a call; exact: an uncached float64 forward on the same tokens
    assert_as_accurate(logprobs(again), logprobs(out), exact_logprobs(tiny_model, out))
    other = driver.generate(
        MIXED[:3], SamplingParams(temperature=1.0, max_new_tokens=8, n=3, seed=6)
    )
    assert any(not np.array_equal(a.token_ids, b.token_ids) for a, b in zip(out, other))


@pytest.mark.slow  # 11 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_per_request_params_mix_in_one_batch(tiny_model, tiny_engine):
    sps = [
        SamplingParams(temperature=0.0, max_new_tokens=6, raw_logprobs=True),
        SamplingParams(temperature=1.5, top_k=4, max_new_tokens=6, raw_logprobs=True),
        SamplingParams(temperature=0.8, top_p=0.5, max_new_tokens=6, raw_logprobs=True),
    ]
    out = RolloutDriver(tiny_engine).generate(MIXED[:3], sps)
    np.testing.assert_array_equal(out[0].token_ids, naive_greedy(tiny_model, MIXED[0], 6, (5,)))
    # Every sampled token of every sample, against an uncached forward and a numpy filter;
    # its logprobs as accurate as that forward's (`testing.assert_as_accurate`): trusted,
    # the float32 forward; exact, its float64 twin's.
    rows = [[p + c.token_ids[:t].tolist() for t in range(len(c.token_ids))]
            for c, p in zip(out, MIXED[:3], strict=True)]  # fmt: skip
    with jax.enable_x64(True):
        twin = float64_twin(tiny_model)
        exact_logits = [full_logits(twin, r) for r in rows]
    got, trusted, exact = ({"raw": [], "filtered": []} for _ in range(3))
    for c, r, x, sp in zip(out, rows, exact_logits, sps, strict=True):
        assert len(c.token_ids) == 6 or c.finish_reason == "eos"
        logits = full_logits(tiny_model, r)
        for t, tok in enumerate(c.token_ids):
            got["raw"].append(c.raw_logprobs[t])
            trusted["raw"].append(jax.nn.log_softmax(logits[t])[tok])
            exact["raw"].append(x[t, tok] - np.logaddexp.reduce(x[t]))
            if sp.temperature == 0.0:
                assert tok == logits[t].argmax() and c.logprobs[t] == 0.0
                continue
            temperature = np.float32(sp.temperature)  # as the sampler holds it
            kept = _kept_tokens(logits[t].astype(np.float64) / temperature, sp.top_k, sp.top_p)
            assert tok in kept, (t, tok, kept)
            got["filtered"].append(c.logprobs[t])
            trusted["filtered"].append(
                jax.nn.log_softmax(logits[t][kept] / temperature)[kept.index(tok)]
            )
            scaled = x[t, kept] / float(temperature)
            exact["filtered"].append(scaled[kept.index(tok)] - np.logaddexp.reduce(scaled))
    arrays = lambda d, dtype=np.float32: {k: np.asarray(v, dtype) for k, v in d.items()}
    assert_as_accurate(arrays(got), arrays(trusted), arrays(exact, np.float64))


def _kept_tokens(scaled, top_k, top_p):
    """Token ids top-k then top-p keep (numpy; the engine's filter is jitted JAX)."""
    order = np.argsort(-scaled, kind="stable")
    if top_k:
        order = order[:top_k]
    probs = np.exp(scaled[order] - np.logaddexp.reduce(scaled[order]))
    mass_before = np.cumsum(probs) - probs
    return [int(i) for r, i in enumerate(order) if r == 0 or mass_before[r] < top_p]


@pytest.mark.slow  # 12 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_prompt_buckets_bound_compiles(tiny_engine):
    before = dict(tiny_engine.trace_counts)
    prompts = [list(range(6, 6 + n)) for n in range(1, 33)]  # 32 distinct lengths
    RolloutDriver(tiny_engine, steps_per_call=8).generate(prompts, SamplingParams(max_new_tokens=2))
    new = {k: v - before.get(k, 0) for k, v in tiny_engine.trace_counts.items()}
    prefills = sum(v for k, v in tiny_engine.trace_counts.items() if k.startswith("prefill["))
    # Batched prefills: 1, 2 or 4 prompts (4 slots) x widths 16 and 32.
    assert prefills <= 6, tiny_engine.trace_counts
    assert tiny_engine.trace_counts["generate_steps[8]"] == 1
    assert all(v <= 2 for v in new.values()), new


@pytest.mark.slow  # 9 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_long_prompt_is_a_clear_error_or_a_skip(tiny_engine):
    long = list(range(6, 46))  # 40 > max_prefill_length 32
    driver = RolloutDriver(tiny_engine)
    with pytest.raises(ValueError, match="max_prefill_length"):
        driver.generate([MIXED[0], long], GREEDY)
    out = driver.generate([MIXED[0], long], GREEDY, on_long_prompt="skip")
    assert out[1].finish_reason == "prompt_too_long" and len(out[1].token_ids) == 0
    assert out[0].finish_reason in ("eos", "length") and len(out[0].token_ids) > 0


@pytest.mark.slow  # the engine's prefill and decode compiles, shared with the test above
def test_prompt_ids_outside_the_vocabulary_are_refused_or_skipped(tiny_engine):
    """An id >= V would embed as NaN and a negative one as the last row: the driver refuses
    them as it refuses over-long prompts (vLLM's rule and words, `prompt_checks`)."""
    vocab = tiny_engine.config.vocab_size
    bad = [[*MIXED[0], vocab], [-1, *MIXED[0]]]
    driver = RolloutDriver(tiny_engine)
    for prompt in bad:
        with pytest.raises(ValueError, match=rf"outside the vocabulary \[0, {vocab}\)"):
            driver.generate([MIXED[0], prompt], GREEDY)
    out = driver.generate([MIXED[0], *bad], GREEDY, on_long_prompt="skip")
    assert [c.finish_reason for c in out[1:]] == ["prompt_too_long"] * 2
    assert all(len(c.token_ids) == 0 and "outside the vocabulary" in str(c.error) for c in out[1:])
    assert out[0].finish_reason in ("eos", "length") and len(out[0].token_ids) > 0


@pytest.mark.slow  # 25 s in a loaded 2-worker run, AMD EPYC AVX2
def test_stop_strings_span_tokens_and_cut_exactly(builtin):
    _, tok, engine = builtin
    driver = RolloutDriver(engine, steps_per_call=8)
    sp = SamplingParams(temperature=1.0, max_new_tokens=40, seed=3)
    free = driver.generate(["Question: 1+2?"], sp)[0]
    ids = free.token_ids.tolist()
    printable = [len(t) == 1 and t.isprintable() for t in (tok.decode([i]) for i in ids)]
    i = next(i for i in range(3, len(ids)) if all(printable[i : i + 3]))
    stop = tok.decode(ids[i : i + 3])  # three single-character tokens: the match spans them
    text = tok.decode(ids, skip_special_tokens=False)
    cut = driver.generate(
        ["Question: 1+2?"], SamplingParams(**{**vars(sp), "stop": (stop, "~~~~")})
    )
    cut = cut[0]
    end = text.index(stop) + len(stop)
    assert cut.finish_reason == "stop" and cut.stop_string == stop
    assert tok.decode(cut.token_ids.tolist(), skip_special_tokens=False) == text[:end]
    np.testing.assert_array_equal(cut.token_ids, free.token_ids[: len(cut.token_ids)])


def _first_stop(tok, ids, stop):
    """Tokens up to and including the one that completes the first `stop`."""
    return next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))


@pytest.mark.slow  # 8 s in a loaded 2-worker run, AMD EPYC AVX2
def test_tool_turn_appends_masked_tokens_and_resumes(builtin):
    """A scripted tool answers the first stop; its tokens are masked, and decoding resumes
    from the appended cache: each later token's raw logprob is as accurate as the full
    forward's."""
    model, tok, engine = builtin
    prompt = "Compute: 2*3"
    driver = RolloutDriver(engine, steps_per_call=8)
    sp = SamplingParams(temperature=1.0, max_new_tokens=40, seed=1, raw_logprobs=True)
    ids = driver.generate([prompt], sp)[0].token_ids.tolist()
    printable = [len(t) == 1 and t.isprintable() for t in (tok.decode([i]) for i in ids)]
    i = next(i for i in range(2, len(ids)) if all(printable[i : i + 2]))
    stop = tok.decode(ids[i : i + 2])
    k = _first_stop(tok, ids, stop)
    calls = []

    def tool(text):
        calls.append(text)
        return "<out:6>" if len(calls) == 1 else None

    c = driver.generate([prompt], SamplingParams(**{**vars(sp), "stop": (stop,)}), tool=tool)[0]
    obs = tok("<out:6>", add_special_tokens=False)["input_ids"]
    assert calls[0] == tok.decode(ids[:k])
    assert c.tool_calls == 1
    mask, n = c.response_mask, k + len(obs)
    np.testing.assert_array_equal(c.token_ids[:k], ids[:k])
    np.testing.assert_array_equal(mask[:k], 1)
    np.testing.assert_array_equal(mask[k:n], 0)
    np.testing.assert_array_equal(c.token_ids[k:n], obs)
    np.testing.assert_array_equal(c.logprobs[k:n], 0.0)
    assert len(c.token_ids) > n and mask[n:].all()  # generation continued after the tool
    prompt_ids = tok(prompt)["input_ids"]
    rows = [prompt_ids + c.token_ids[:t].tolist() for t in range(n, len(c.token_ids))]
    logits = full_logits(model, rows, width=96)
    ref = np.asarray(jax.nn.log_softmax(logits))[np.arange(len(rows)), c.token_ids[n:]]
    # trusted: the uncached float32 forward; exact: the same in float64. Factor 8: the trained
    # model is sure of most tokens (logprob ~0, error ~1e-7), so the max is over the 3-4 it
    # is not, nearly one sample; max|got - exact| / max|trusted - exact| measured 0.34-3.6
    # (3 prompts; XLA's AVX-512, AVX2, AVX and SSE4.2 code paths).
    assert_as_accurate(c.raw_logprobs[n:], ref, exact_logprobs(model, [c])[n:], factor=8)
    arrays = pad_completions([c])
    assert arrays["response_mask"][0].sum() == mask.sum()


def _turns(mask) -> list[int]:
    """Lengths of the model's turns: the runs of 1 in a response mask."""
    runs, n = [], 0
    for m in [*mask.tolist(), 0]:
        if m:
            n += 1
        elif n:
            runs, n = [*runs, n], 0
    return runs


@pytest.mark.slow  # 16 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_a_turn_budget_cuts_each_turn_and_ends_the_sample(builtin):
    """`max_turn_tokens` = 6: the first turn stops (on a stop string) within it, the tool
    answers, and the second turn is cut at exactly 6 tokens, ending the sample "length".
    The tokens equal the same run's without the budget, up to the cut; the whole budget
    is untouched (it would allow 40)."""
    _, tok, engine = builtin
    driver = RolloutDriver(engine, steps_per_call=8)
    sp = SamplingParams(temperature=1.0, max_new_tokens=40, seed=1)
    ids = driver.generate(["Compute: 2*3"], sp)[0].token_ids.tolist()
    printable = [len(t) == 1 and t.isprintable() for t in (tok.decode([i]) for i in ids)]
    i = next(i for i in range(1, 4) if printable[i])  # a stop within the first 5 tokens
    stop = tok.decode(ids[i : i + 1])
    k = _first_stop(tok, ids, stop)
    assert k <= 5

    def tool(text):
        return "<out>" if text.count(stop) == 1 else None

    free = SamplingParams(**{**vars(sp), "stop": (stop,)})
    capped = SamplingParams(**{**vars(free), "max_turn_tokens": 6})
    ref, c = (driver.generate(["Compute: 2*3"], p, tool=tool)[0] for p in (free, capped))
    turns = _turns(c.response_mask)
    assert c.tool_calls == 1 and turns == [k, 6] and c.finish_reason == "length"
    assert _turns(ref.response_mask)[:1] == [k] and _turns(ref.response_mask)[1] > 6
    np.testing.assert_array_equal(c.token_ids, ref.token_ids[: len(c.token_ids)])
    np.testing.assert_array_equal(c.response_mask, ref.response_mask[: len(c.token_ids)])
    with pytest.raises(ValueError, match="max_turn_tokens"):
        SamplingParams(max_turn_tokens=0)


@pytest.mark.slow  # 16 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_failing_tool_ends_only_its_sample(builtin):
    """Prompt 0's samples hit stop strings and call a tool that raises: each ends there with
    the error. Prompt 1 (no stop strings, same batch) goes on exactly as without a tool."""
    _, _, engine = builtin
    calls = []

    def tool(text):
        calls.append(text)
        raise RuntimeError("sandbox down")

    stopping = SamplingParams(temperature=1.0, max_new_tokens=20, stop=(".",), n=2)
    free = SamplingParams(temperature=1.0, max_new_tokens=20, n=2, seed=3)
    out = RolloutDriver(engine).generate(["Hi", "Yo"], [stopping, free], tool=tool)
    assert len(out) == 4 and len(calls) == 2
    for c in out[:2]:
        assert c.finish_reason == "stop" and c.error and "sandbox down" in c.error
        assert len(c.token_ids) < 20
    alone = RolloutDriver(engine).generate(["Yo"], free, prompt_indices=[1])
    for c, ref in zip(out[2:], alone):
        assert c.error is None and c.finish_reason in ("eos", "length")
        np.testing.assert_array_equal(c.token_ids, ref.token_ids)


def test_stop_search_decodes_only_new_text():
    """Looking for stop strings decodes the tokens sampled since the last check and a
    short look-back, not the whole turn again (which would be quadratic in its length),
    and still cuts exactly after the first match."""
    from jaxrl_llm.assets import builtin_checkpoint
    from jaxrl_llm.models import load_tokenizer
    from jaxrl_llm.rollout import RolloutDriver, SamplingParams
    from jaxrl_llm.testing import ScriptedEngine

    tok = load_tokenizer(builtin_checkpoint())
    decoded = []
    real_decode = tok.decode

    def counting_decode(ids, **kw):
        decoded.append(len(ids))
        return real_decode(ids, **kw)

    tok.decode = counting_decode
    try:
        turn = "a" * 600 + "STOP here"
        engine = ScriptedEngine(tok, [turn], batch=1, filler="~")
        driver = RolloutDriver(engine, tok, steps_per_call=8)
        sp = SamplingParams(max_new_tokens=2000, stop=("STOP",), temperature=0.0)
        (out,) = driver.generate(["q"], sp)
    finally:
        tok.decode = real_decode
    assert out.finish_reason == "stop" and out.text.endswith("a" * 10 + "STOP")
    stop_decodes = sum(decoded) - len(out.token_ids)  # the final text decode excluded
    assert stop_decodes < 12 * len(out.token_ids)  # whole-turn decoding: ~ len^2 / 16


@pytest.mark.slow  # 14 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@pytest.mark.parametrize("workers", [3, 4])
def test_tool_calls_run_on_tool_workers_threads_at_once(builtin, workers):
    """`tool_workers` calls are in flight together (`RolloutConfig.tool_workers`): four
    samples' calls each wait at a barrier of four, which only passes when four run at once;
    with three workers the fourth call queues and the barrier breaks (each sample then ends
    with that error)."""
    import threading

    _, _, engine = builtin
    barrier = threading.Barrier(4, timeout=3 if workers < 4 else 30)

    def tool(text):
        barrier.wait()
        return None  # no observation: the sample ends here

    sp = SamplingParams(temperature=1.0, max_new_tokens=40, stop=(".",), n=4, seed=5)
    out = RolloutDriver(engine, tool_workers=workers).generate(["Hi"], sp, tool=tool)
    assert all(c.finish_reason == "stop" for c in out)
    broken = [c.error for c in out if c.error]
    assert (not broken) if workers == 4 else broken, broken


@pytest.mark.slow  # measured: 10.0 s (fast tier, AMD EPYC, 2026-12-06)
def test_a_call_cut_short_gives_its_pages_back(tiny_model):
    """An exception out of `generate` (an `on_finish` raising, as a scorer may; Ctrl-C)
    left the slots' KV pages reserved in the engine, which outlives the call: with a pool
    sized for the work, every later call failed with a false "needs more KV pages than the
    whole pool holds". The next call now finds the whole pool free and runs."""
    from jaxrl_llm.rollout import Engine

    engine = Engine(tiny_model, max_concurrent_decodes=2, max_cache_length=64, page_size=8,
                    num_pages=8)  # fmt: skip  # one 40-token sample fills the pool
    driver = RolloutDriver(engine, steps_per_call=2)
    short = SamplingParams(temperature=1.0, max_new_tokens=1)
    long = SamplingParams(temperature=1.0, max_new_tokens=40, seed=0)
    prompts = [[5, 6, 7], [8, 9]]

    def scorer_fails(i, completion):
        raise RuntimeError("reward failed")

    with pytest.raises(RuntimeError, match="reward failed"):
        driver.generate(prompts, [short, long], on_finish=scorer_fails)
    assert engine.pages.num_free == engine.num_pages
    assert [c.finish_reason for c in driver.generate(prompts[1:], long)] == ["length"]
    assert engine.pages.num_free == engine.num_pages

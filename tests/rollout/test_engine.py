"""Engine: JetStream API calls against the full forward; weight sync; sharding."""

import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import init_model
from jaxrl_llm.sharding import SAMPLE_RULES, TRAIN_RULES, build_mesh
from jaxrl_llm.testing import assert_as_accurate
from tests.rollout.reference import TINY, exact_logprobs, full_logits


def _prefill(engine, params, prompt):
    padded = np.zeros(engine.prefill_bucket(len(prompt)), np.int32)
    padded[: len(prompt)] = prompt
    return engine.prefill(params=params, padded_tokens=padded, true_length=len(prompt))


def _run(engine, params, prompts, steps, sampling=None):
    """Insert prompts into slots 0.. and take `steps` single steps; tokens, raw lps."""
    from jaxrl_llm.rollout.sampling import SlotSampling

    state = engine.init_decode_state()
    for slot, p in enumerate(prompts):
        prefix = _prefill(engine, params, p)
        if sampling is None:
            state = engine.insert(prefix, state, slot)
        else:
            state = engine.insert_slot(prefix, state, slot, SlotSampling.one(sampling, 9), 99)
    toks, lps, raws = [], [], []
    for _ in range(steps):
        state, rec = engine.generate_steps(params, state, 1)
        toks.append(np.asarray(rec.tokens[0]))
        lps.append(np.asarray(rec.logprobs[0]))
        raws.append(np.asarray(rec.raw_logprobs[0]))
    return np.stack(toks, 1), np.stack(lps, 1), np.stack(raws, 1)


def _exact(model, toks, temperature=1.0):
    """float64 logprobs [prompts, steps] of `toks` [prompts, steps] after each of `PROMPTS`
    (`exact_logprobs`; the temperature as the engine holds it, in float32)."""
    samples = [
        SimpleNamespace(prompt_ids=p, token_ids=t) for p, t in zip(PROMPTS, toks, strict=True)
    ]
    return exact_logprobs(model, samples, float(np.float32(temperature))).reshape(toks.shape)


PROMPTS = [[3, 4, 7], [9, 1, 2, 8, 8, 6, 1, 4, 2], [11, 12, 13, 14, 15, 16]]


@pytest.mark.slow  # 16 s in a loaded 2-worker run, AMD EPYC AVX2
def test_prefill_insert_generate_match_full_forward(tiny_model, tiny_engine):
    """Greedy tokens are the full forward's argmax, and the raw logprobs are as accurate as
    its log_softmax (against its float64 twin, `testing.assert_as_accurate`)."""
    from jaxrl_llm.rollout import SamplingParams

    params = tiny_engine.load_params()
    plain, _, not_asked = _run(tiny_engine, params, PROMPTS, 6)  # JetStream's insert
    np.testing.assert_array_equal(not_asked, 0.0)  # raw logprobs only when asked for
    sp = SamplingParams(temperature=0.0, raw_logprobs=True)
    toks, lps, raws = _run(tiny_engine, params, PROMPTS, 6, sampling=sp)
    np.testing.assert_array_equal(toks, plain)
    toks, lps, raws = (x[: len(PROMPTS)] for x in (toks, lps, raws))  # the slots in use
    trusted = np.zeros(toks.shape, np.float32)  # the uncached float32 forward's
    for b, p in enumerate(PROMPTS):
        seq = list(p)
        for t in range(6):
            logits = full_logits(tiny_model, [seq])[0]
            assert toks[b, t] == int(np.argmax(logits))
            trusted[b, t] = jax.nn.log_softmax(logits)[toks[b, t]]
            seq.append(int(toks[b, t]))
    assert_as_accurate(raws, trusted, _exact(tiny_model, toks))
    np.testing.assert_array_equal(lps, 0.0)


@pytest.mark.slow  # 9 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_sampled_logprobs_equal_full_forward(tiny_model, tiny_engine):
    from jaxrl_llm.rollout import SamplingParams

    params = tiny_engine.load_params()
    sp = SamplingParams(temperature=0.7, raw_logprobs=True)
    toks, lps, raws = (x[: len(PROMPTS)] for x in _run(tiny_engine, params, PROMPTS, 5, sp))
    trusted = {
        "raw": np.zeros(toks.shape, np.float32),
        "tempered": np.zeros(toks.shape, np.float32),
    }
    for b, p in enumerate(PROMPTS):
        seq = list(p)
        for t in range(5):
            logits = full_logits(tiny_model, [seq])[0]
            tok = int(toks[b, t])
            trusted["raw"][b, t] = jax.nn.log_softmax(logits)[tok]
            trusted["tempered"][b, t] = jax.nn.log_softmax(logits / np.float32(0.7))[tok]
            seq.append(tok)
    # trusted: the uncached float32 forward; exact: the same in float64
    exact = {
        "raw": _exact(tiny_model, toks),
        "tempered": _exact(tiny_model, toks, 0.7),
    }
    assert_as_accurate({"raw": raws, "tempered": lps}, trusted, exact)


@pytest.mark.slow  # 6 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_new_params_change_outputs_without_recompiling(tiny_engine):
    params = tiny_engine.load_params()
    from jaxrl_llm.rollout import SamplingParams

    sp = SamplingParams(temperature=0.0, raw_logprobs=True)
    _, _, raws_a = _run(tiny_engine, params, PROMPTS, 3, sampling=sp)
    before = dict(tiny_engine.trace_counts)
    other = nnx.split(init_model(TINY, seed=1))[1]  # "the trainer's next params"
    _, _, raws_b = _run(tiny_engine, other, PROMPTS, 3, sampling=sp)
    assert not np.allclose(raws_a, raws_b)
    assert dict(tiny_engine.trace_counts) == before


def test_same_layout_params_are_not_copied(tiny_engine):
    params = nnx.split(init_model(TINY, seed=2))[1]
    placed = tiny_engine.place_params(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(placed), strict=True):
        assert a is b
        assert a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer()


@pytest.mark.slow  # 10 s in a loaded 2-worker run, AMD EPYC AVX2
def test_reshard_from_training_layout(capsys):
    """Training FSDP x TP params into the sampling layout: one jitted reshard (timed)."""
    from jaxrl_llm.rollout import Engine

    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    model = init_model(TINY, seed=0, mesh=mesh, rules=TRAIN_RULES)
    engine = Engine(model, max_concurrent_decodes=2, max_cache_length=32, mesh=mesh)
    trained = nnx.split(model)[1]
    placed = engine.place_params(trained)  # compiles the identity once
    jax.block_until_ready(placed)
    t0 = time.perf_counter()
    placed = jax.block_until_ready(engine.place_params(trained))
    dt = time.perf_counter() - t0
    moved = [a is not b for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(placed))]
    assert any(moved)
    nbytes = sum(x.nbytes for x in jax.tree.leaves(trained))
    with capsys.disabled():
        print(f"\n[reshard TRAIN->SAMPLE 2x4: {nbytes / 1e6:.2f} MB in {dt * 1e3:.2f} ms]")
    again = engine.place_params(placed)
    assert all(a is b for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(again)))


@pytest.mark.slow  # 35 s in a loaded 2-worker run, AMD EPYC AVX2
def test_sharded_engine_matches_unsharded(tiny_model, tiny_engine):
    from jaxrl_llm.rollout import Engine, SamplingParams

    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    sharded = init_model(TINY, seed=0, mesh=mesh, rules=SAMPLE_RULES)
    engine = Engine(sharded, max_concurrent_decodes=4, max_cache_length=64, max_prefill_length=32,
                    mesh=mesh)  # fmt: skip
    params = engine.load_params()
    spec = jax.tree.leaves(params)[1].sharding.spec
    assert "tensor" in str(jax.tree.leaves(params)[0].sharding.spec) + str(spec)
    sp = SamplingParams(temperature=0.0, raw_logprobs=True)  # JetStream's insert has none
    ours = _run(engine, params, PROMPTS, 4, sampling=sp)
    ref = _run(tiny_engine, tiny_engine.load_params(), PROMPTS, 4, sampling=sp)
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(_run(engine, params, PROMPTS, 4)[0], ref[0])
    # trusted: the unsharded engine; exact: an uncached float64 forward on the same tokens
    used = slice(len(PROMPTS))
    assert_as_accurate(ours[2][used], ref[2][used], _exact(tiny_model, ref[0][used]))
    state = engine.init_decode_state()
    assert state.page_table.sharding.spec[0] == "fsdp"  # slots split over the batch axes
    # The pool: pages over the slots' batch axes (each shard's slots use its pages), kv
    # heads over tensor.
    assert tuple(state.kv_pages[0].sharding.spec)[:3] == ("fsdp", None, "tensor")


@pytest.mark.slow  # two engines' compiles
def test_a_sharded_int8_pool_decodes_as_the_unsharded_one(tiny_model):
    """An int8 KV pool (values and their per-head scales) splits as the float pool does and
    the sharded engine decodes the unsharded one's tokens."""
    from jaxrl_llm.models.kv_int8 import Int8Pages
    from jaxrl_llm.rollout import Engine

    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    sharded = init_model(TINY, seed=0, mesh=mesh, rules=SAMPLE_RULES)
    kw = dict(max_concurrent_decodes=4, max_cache_length=64, max_prefill_length=32, kv_dtype="int8")
    engine = Engine(sharded, mesh=mesh, **kw)
    alone = Engine(tiny_model, **kw)
    ours = _run(engine, engine.load_params(), PROMPTS, 4)
    ref = _run(alone, alone.load_params(), PROMPTS, 4)
    np.testing.assert_array_equal(ours[0], ref[0])
    pool = engine.init_decode_state().kv_pages[0]
    assert isinstance(pool, Int8Pages)
    assert tuple(pool.values.sharding.spec)[:3] == ("fsdp", None, "tensor")
    assert tuple(pool.scales.sharding.spec)[:3] == ("fsdp", None, "tensor")


def test_prefill_rejects_bad_lengths(tiny_engine):
    params = tiny_engine.load_params()
    with pytest.raises(ValueError, match="max_prefill_length"):
        tiny_engine.prefill(params=params, padded_tokens=np.ones(40, np.int32), true_length=40)
    with pytest.raises(ValueError, match="true_length"):
        tiny_engine.prefill(params=params, padded_tokens=np.ones(16, np.int32), true_length=0)


def test_prefill_refuses_ids_outside_the_vocabulary(tiny_engine):
    """The Engine API called directly (JetStream's Driver, a user) refuses what the drivers
    refuse (`prompt_checks`): an id >= V embedded as NaN, a negative one as the last row.
    Padding past `true_length` is not read, so it is not checked."""
    params, V = tiny_engine.load_params(), tiny_engine.config.vocab_size
    for bad in (V, -1):
        ids = np.array([1, 2, bad, 3], np.int32)
        with pytest.raises(ValueError, match=f"token id {bad} at position 2 is outside"):
            tiny_engine.prefill(params=params, padded_tokens=ids, true_length=4)
        with pytest.raises(ValueError, match=f"prompt 1: token id {bad} at position 2"):
            tiny_engine.prefill_many(params, [ids[:2], ids])
    padded = np.array([1, 2, V + 5, V + 5], np.int32)  # junk padding: never embedded
    tiny_engine.prefill(params=params, padded_tokens=padded, true_length=2)


@pytest.mark.slow  # 13 s in a loaded 2-worker run, AMD EPYC AVX2
def test_engine_without_own_params_needs_them_passed(tiny_model):
    from flax import nnx

    from jaxrl_llm.rollout import Engine, generate

    engine = Engine(tiny_model, max_concurrent_decodes=2, max_cache_length=32, keep_params=False)
    with pytest.raises(ValueError, match="keep_params=False"):
        engine.load_params()
    params = nnx.split(tiny_model)[1]
    out = generate(engine, [[1, 2, 3]], params=params)
    assert len(out) == 1 and len(out[0].token_ids) > 0


@pytest.mark.slow  # 10 s beside a loaded 2-worker run, Intel Xeon
def test_jetstream_inserts_of_one_prompt_sample_apart(tiny_model):
    """JetStream's `insert` with a sampling default: each insert draws with its own seed, so
    one prompt in four slots gives four samples (one seed for every slot gave four copies of
    one), and an engine started with the same seed repeats them in insert order."""
    from jaxrl_llm.rollout import Engine, SamplingParams

    def four_rows():
        engine = Engine(tiny_model, max_concurrent_decodes=4, max_cache_length=32,
                        max_prefill_length=16,
                        default_sampling=SamplingParams(temperature=1.0, seed=7))  # fmt: skip
        return _run(engine, engine.load_params(), [PROMPTS[0]] * 4, 12)[0]

    rows = four_rows()
    assert len({tuple(r) for r in rows}) == 4, rows
    np.testing.assert_array_equal(four_rows(), rows)

"""The engine's paged KV cache: exact against full recomputation, groups sharing prompt
pages, admission by free pages, and page accounting that never leaks."""

import gc

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_llm.rollout.pages import SlotPages
from jaxrl_llm.testing import assert_as_accurate
from tests.rollout.reference import exact_logprobs, full_logits

# Lengths around the page size (4): below, exactly one page, across pages.
PROMPTS = [[3, 4, 7], [9, 1, 2, 8], [11, 12, 13, 14, 15], [6] * 9, [20, 21], [7, 7, 8, 9, 1, 2]]


def _engine(model, **kw):
    from jaxrl_llm.rollout import Engine

    kw = {"max_concurrent_decodes": 3, "max_cache_length": 40, "max_prefill_length": 16,
          "page_size": 4, **kw}  # fmt: skip
    return Engine(model, **kw)


def _generate(engine, n=2, temperature=0.0, max_new=10):
    from jaxrl_llm.rollout import RolloutDriver, SamplingParams

    sp = SamplingParams(
        temperature=temperature, max_new_tokens=max_new, n=n, seed=7, raw_logprobs=True
    )
    return RolloutDriver(engine, steps_per_call=3).generate(PROMPTS, sp)


@pytest.mark.slow  # 32 s in a loaded 2-worker run, AMD EPYC AVX2
def test_paged_decoding_equals_full_recompute(tiny_model):
    """Greedy tokens of every sample equal an uncached forward's, and their raw logprobs are
    as accurate as its (against its float64 twin, `testing.assert_as_accurate`), with 3
    slots cycling through 12 samples, so pages are freed and reused."""
    engine = _engine(tiny_model)
    out = _generate(engine)
    assert len(out) == 12 and engine.pages.num_free == engine.num_pages - _held(engine)
    picks = []
    for c in out:
        seq = list(c.prompt_ids) + list(c.token_ids)
        P = len(c.prompt_ids)
        rows = [seq[: P + t] for t in range(len(c.token_ids))]
        logits = full_logits(tiny_model, rows)
        logp = jax.nn.log_softmax(logits)
        np.testing.assert_array_equal(c.token_ids, logits.argmax(-1))
        picks.append(np.take_along_axis(np.asarray(logp), c.token_ids[:, None], 1)[:, 0])
    raw = np.concatenate([c.raw_logprobs for c in out])
    # trusted: the uncached float32 forward; exact: the same in float64
    assert_as_accurate(raw, np.concatenate(picks), exact_logprobs(tiny_model, out))


def _held(engine):
    """Pages still held: prompts whose prefix object is alive (the driver dropped them)."""
    gc.collect()
    return int((engine.pages.refs() > 0).sum())


@pytest.mark.slow  # 45 s in a loaded 2-worker run, AMD EPYC AVX2
def test_group_samples_equal_independent_runs(tiny_model):
    """n sampled continuations sharing a prompt's pages equal the same seeds run one at a
    time in a one-slot engine, and a group holds one copy of its full prompt pages."""
    shared = _generate(_engine(tiny_model, max_concurrent_decodes=4), n=3, temperature=1.0)
    alone = _generate(_engine(tiny_model, max_concurrent_decodes=1), n=3, temperature=1.0)
    for a, b in zip(shared, alone, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
    logprobs = lambda samples: np.concatenate([c.logprobs for c in samples])
    # trusted: the one-slot engine's; exact: an uncached float64 forward on the same tokens
    assert_as_accurate(logprobs(shared), logprobs(alone), exact_logprobs(tiny_model, alone))
    pages = SlotPages(batch=3, num_pages=64, page_size=4, pages_per_seq=10)
    prefix = object.__new__(type("P", (), {}))
    pages.register(prefix, [9])  # two full pages + a partial one
    rows = [pages.admit(s, (prefix, 0), 9, 8, 12)[0] for s in range(3)]
    assert all((r[:2] == rows[0][:2]).all() for r in rows)  # full pages shared
    assert len({int(r[2]) for r in rows}) == 3  # the partial page copied per sample
    assert pages.num_free == 64 - 2 - 3 * 3  # 2 shared + 3 own pages per sample


@pytest.mark.slow  # 29 s in a loaded 2-worker run, AMD EPYC AVX2
def test_pool_pressure_queues_instead_of_failing(tiny_model):
    """A pool with room for about two samples still completes every request, equal to a
    roomy pool's results; a sample larger than the whole pool is a clear error."""
    roomy = _generate(_engine(tiny_model))
    tight_engine = _engine(tiny_model, num_pages=9)  # a sample reserves up to 4 pages
    tight = _generate(tight_engine)
    for a, b in zip(roomy, tight, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
    tiny_pool = _engine(tiny_model, num_pages=2)
    with pytest.raises(ValueError, match="more KV pages than the whole pool"):
        _generate(tiny_pool)


@pytest.mark.slow  # 2 engines' compiles
def test_a_prompts_pages_go_back_once_its_last_sample_is_inserted(tiny_model):
    """Two prompts prefilled together, each of 3 full pages, on a pool of 6 pages of which
    one sample takes 4: the first prompt's shared pages go back to the pool when its last
    sample has been inserted and has finished, not when the prefix (which still serves the
    second prompt) is collected, so the second prompt gets its pages; the results equal a
    roomy pool's and every page is free after."""
    from jaxrl_llm.rollout import RolloutDriver, SamplingParams

    rng = np.random.RandomState(0)
    prompts = [list(rng.randint(6, 128, 48)) for _ in range(2)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, n=2, seed=1)
    kw = {"max_concurrent_decodes": 4, "max_cache_length": 64, "max_prefill_length": 48,
          "page_size": 16}  # fmt: skip
    roomy = RolloutDriver(_engine(tiny_model, **kw), steps_per_call=4).generate(prompts, sp)
    small = _engine(tiny_model, num_pages=6, **kw)
    tight = RolloutDriver(small, steps_per_call=4).generate(prompts, sp)
    for a, b in zip(roomy, tight, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
    gc.collect()
    assert small.pages.num_free == small.num_pages and not small.pages.refs().any()


class _Prefix:
    pass


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(1, 30),
                          st.integers(1, 40)), min_size=1, max_size=1000))  # fmt: skip
def test_page_accounting_never_leaks(ops):
    """Random admit / release / prefix-drop sequences over a pool in two shards, prompts
    shared between slots: reference counts equal the holders, no page is owned twice, a
    slot's pages lie in its shard, and everything returns to the pool at the end."""
    pages = SlotPages(batch=4, num_pages=40, page_size=4, pages_per_seq=16, shards=2)
    prefixes: dict[int, tuple[_Prefix, int]] = {}
    for slot, op, length, max_new in ops:
        if op == 0:
            pages.release(slot)
        elif op == 1:
            prefixes.pop(length % 3, None)  # drop a prefix: its hold goes when it is freed
        else:
            prefix, plen = prefixes.setdefault(length % 3, (_Prefix(), length))
            pages.release(slot)
            if pages.fits((prefix, 0), plen, max_new, slot):
                pages.admit(slot, (prefix, 0), plen, max_new, plen)
            prefix = None
        _check(pages)
    for slot in range(4):
        pages.release(slot)
    # The prefixes are in no reference cycle, so clearing them frees them (and their pages)
    # at once: no gc.collect(), which walks the whole heap (0.5 s per example alone, minutes
    # for 40 examples in a worker that has traced models).
    prefixes.clear()
    assert pages.num_free == 40 and not pages.refs().any()


def _check(pages: SlotPages):
    refs = pages.refs()
    holders = np.zeros_like(refs)
    for held in pages._slots:
        np.add.at(holders, held, 1)
    for shared in pages._shared.values():
        np.add.at(holders, shared, 1)
    np.testing.assert_array_equal(refs, holders)
    assert pages.num_free == int((refs == 0).sum())
    owned = [p for held in pages._slots for p in held if refs[p] == 1]
    assert len(owned) == len(set(owned))
    for slot, held in enumerate(pages._slots):  # shard s owns pages [20 s, 20 s + 20)
        assert all(p // 20 == pages.shard_of(slot) for p in held)


@pytest.mark.slow  # 3 engines' compiles
def test_int8_kv_decoding_is_the_float_engines_on_rounded_keys_and_values(tiny_model, monkeypatch):
    """`kv_dtype="int8"`: the engine decodes as a float engine whose pool holds each written
    key and value already rounded the same way (`kv_int8.quantize_kv`, the reference written
    here by wrapping the float pool's writes): the same greedy tokens, and raw logprobs as
    close to that reference as a float32 engine is to its float64 forward, through prefix
    sharing (n = 2), page reuse and the dequantising walks. The pool holds 1 byte per value
    plus a float32 scale per head."""
    from jaxrl_llm.models import kv_int8, layers, paged
    from jaxrl_llm.rollout import programs

    floats = _generate(_engine(tiny_model))
    int8_engine = _engine(tiny_model, kv_dtype="int8")
    quantised = _generate(int8_engine)
    layer = int8_engine.init_decode_state().kv_pages[0]
    assert isinstance(layer, kv_int8.Int8Pages) and layer.values.dtype == np.int8
    cfg = tiny_model.config
    assert int8_engine.kv_bytes_per_token() == cfg.num_layers * 2 * cfg.num_kv_heads * (
        cfg.head_dim + 4
    )

    write = paged.write_kv

    def rounded(pool, k, v, slots):  # a float pool given the values an int8 pool stores
        deq = lambda x: (lambda q, s: q.astype(np.float32) * s[..., None])(*kv_int8.quantize_kv(x))
        return write(pool, deq(k), deq(v), slots)

    for module in (paged, layers, programs):
        monkeypatch.setattr(module, "write_kv", rounded)
    reference = _generate(_engine(tiny_model))
    for a, b in zip(quantised, reference, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
    raw = lambda samples: np.concatenate([c.raw_logprobs for c in samples])
    # this host's float32 error at these magnitudes: the float engine against float64
    noise = np.abs(raw(floats) - exact_logprobs(tiny_model, floats)).max()
    eps = np.finfo(np.float32).eps * np.abs(raw(reference)).max()
    assert np.abs(raw(quantised) - raw(reference)).max() <= 4 * noise + eps
    assert np.abs(raw(quantised) - raw(floats)).max() > 4 * noise + eps  # it did round


@pytest.mark.slow  # 12 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@pytest.mark.parametrize("weights", ["float32", "w8a8", "int8"])
def test_a_decode_step_copies_no_weight(weights, monkeypatch):
    """The compiled decode step reads each weight where it lies: no op in it produces an
    array of a weight matrix's size (a transpose, copy or dequantised copy of a weight,
    paid in every step), with float weights and with the int8 sampler's (W8A8, and
    weight-only through the int8 CPU kernel, `models.int8_cpu`).
    Contracting o_proj [N, H, D] over two dims did that on XLA:CPU (a whole-weight
    transpose per layer and step; 7% of a 0.5B-shape step); `lora.dense` contracts one
    merged dim; weight-only int8 converted each whole weight to float before the kernel.
    Shapes chosen so that no activation or KV array has a weight's size."""
    import math
    import re

    from flax import nnx

    from jaxrl_llm.models import CausalLM, ModelConfig, init_model, int8_cpu
    from jaxrl_llm.models.quant import int8_projections
    from jaxrl_llm.rollout import Engine

    cfg = ModelConfig(vocab_size=160, hidden_size=96, intermediate_size=224, num_heads=6,
                      num_kv_heads=2, head_dim=24, num_layers=2)  # fmt: skip
    model = init_model(cfg, seed=0)
    assert isinstance(model, CausalLM)
    if weights == "int8" and int8_cpu.target_name() is None:
        pytest.skip("no C++ compiler: the int8 CPU kernel cannot be built")
    monkeypatch.setattr(int8_cpu, "MIN_WEIGHT_ELEMENTS", 0)  # these weights are small
    if weights != "float32":
        int8_projections(model, activations=weights == "w8a8")
    weight_sizes = {x.size for x in jax.tree.leaves(nnx.state(model)) if x.size >= 1024}
    engine = Engine(model, max_concurrent_decodes=2, max_cache_length=40, max_prefill_length=8)
    params = engine.place_params(engine.load_params())
    hlo = engine._steps_fn(2).lower(params, engine.init_decode_state()).compile().as_text()
    assert hlo is not None
    passive = {"parameter", "get-tuple-element", "bitcast", "tuple", "while", "conditional"}
    made = []
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = \w+\[([\d,]*)\]\S* ([\w-]+)\(", hlo, re.M):
        name, dims, op = m.groups()
        size = math.prod(int(d) for d in dims.split(",")) if dims else 1
        if op not in passive and size in weight_sizes:
            made.append(f"{name} ({op} [{dims}])")
    assert not made, f"the decode step re-lays out weights: {made}"

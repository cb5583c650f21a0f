"""Per-slot sampling: greedy, temperature, top-k, top-p; logprobs; seeds."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.rollout.sampling import SamplingParams, SlotSampling, filter_mask, sample_tokens
from jaxrl_llm.testing import log_softmax_tolerance

V = 32


def _slots(temperature, top_k, top_p, seed, raw=True):
    return SlotSampling(
        jnp.asarray(temperature, jnp.float32),
        jnp.asarray(top_k, jnp.int32),
        jnp.asarray(top_p, jnp.float32),
        jnp.asarray(seed, jnp.uint32),
        jnp.broadcast_to(jnp.asarray(raw), np.shape(seed)),
    )


_sample = jax.jit(sample_tokens)


def test_greedy_and_raw_logprobs():
    logits = jax.random.normal(jax.random.key(0), (3, V))
    s = _slots([0.0] * 3, [0] * 3, [1.0] * 3, [1, 2, 3])
    tok, lp, raw = _sample(logits, s, jnp.arange(3))
    np.testing.assert_array_equal(tok, np.argmax(logits, -1))
    np.testing.assert_array_equal(lp, 0.0)  # a point mass
    # against float64, within the float32 log-softmax's rounding bound (stays below 1e-4)
    ref, tol = (x[np.arange(3), tok] for x in log_softmax_tolerance(logits))
    assert tol.max() < 1e-4
    np.testing.assert_array_less(np.abs(np.asarray(raw, np.float64) - ref), tol)


def test_raw_logprobs_only_where_asked():
    """Slots that did not ask get 0; the others are unchanged; tokens and sampled logprobs
    do not depend on who asked."""
    logits = jax.random.normal(jax.random.key(2), (3, V))
    asked = _sample(logits, _slots([0.7] * 3, [0] * 3, [1.0] * 3, [4, 5, 6]), jnp.arange(3))
    some = _slots([0.7] * 3, [0] * 3, [1.0] * 3, [4, 5, 6], raw=[True, False, True])
    got = _sample(logits, some, jnp.arange(3))
    off = _slots([0.7] * 3, [0] * 3, [1.0] * 3, [4, 5, 6], raw=False)
    none = _sample(logits, off, jnp.arange(3))
    np.testing.assert_array_equal(got[0], asked[0])
    np.testing.assert_array_equal(got[1], asked[1])
    np.testing.assert_array_equal(got[2], np.where([True, False, True], asked[2], 0.0))
    np.testing.assert_array_equal(none[2], 0.0)
    np.testing.assert_array_equal(none[0], asked[0])


def test_tempered_logprob_is_log_softmax_of_scaled_logits():
    logits = jax.random.normal(jax.random.key(1), (4, V)) * 3
    temps = [0.5, 1.0, 1.7, 2.0]
    tok, lp, raw = _sample(logits, _slots(temps, [0] * 4, [1.0] * 4, [7] * 4), jnp.arange(4))
    # against float64, within the float32 log-softmax's rounding bound (each temperature as
    # the sampler holds it, in float32)
    for b, t in enumerate(np.float32(temps)):
        for got, temp in ((lp, float(t)), (raw, 1.0)):
            ref, tol = (x[tok[b]] for x in log_softmax_tolerance(logits[b], temp))
            assert tol < 1e-4
            assert abs(float(got[b]) - ref) <= tol, (b, temp, float(got[b]) - ref, tol)


def test_top_k_top_p_never_emit_excluded_tokens_mixed_in_one_batch():
    logits = jnp.tile(jnp.linspace(4.0, -4.0, V)[None], (4, 1))  # token 0 most likely
    probs = np.asarray(jax.nn.softmax(logits[0]))
    # slot 0: top-3; slot 1: nucleus 0.5; slot 2: plain; slot 3: greedy
    s = _slots([1.0, 1.0, 1.0, 0.0], [3, 0, 0, 0], [1.0, 0.5, 1.0, 1.0], [0, 1, 2, 3])
    nucleus = int(np.searchsorted(np.cumsum(probs), 0.5) + 1)
    traces = []

    @jax.jit
    def sample(*args):
        traces.append(1)
        return sample_tokens(*args)

    seen = [set() for _ in range(4)]
    for pos in range(300):
        tok, lp, _ = sample(logits, s, jnp.full(4, pos))
        for b, t in enumerate(np.asarray(tok)):
            seen[b].add(int(t))
    assert seen[0] == {0, 1, 2}
    assert seen[1] <= set(range(nucleus)) and len(seen[1]) == nucleus
    assert len(seen[2]) > nucleus
    assert seen[3] == {0}
    assert len(traces) == 1  # mixing parameters does not recompile
    # Filtered logprobs are under the renormalised top-k distribution.
    tok, lp, _ = _sample(logits, s, jnp.zeros(4, jnp.int32))
    # (the excluded logits' exp is an exact 0: only the 3 kept terms round in the sum)
    kept, tol = (x[tok[0]] for x in log_softmax_tolerance(logits[0, :3]))
    assert tol < 1e-4
    np.testing.assert_allclose(lp[0], kept, rtol=0, atol=tol)


def test_filter_mask_ties_keep_exactly_k():
    logits = jnp.zeros((1, V))
    mask = filter_mask(logits, jnp.asarray([5]), jnp.asarray([1.0]))
    assert int(mask.sum()) == 5


def test_no_top_p_keeps_the_tail_float32_cannot_add():
    """top_p = 1 filters nothing, also where the mass before a tail token rounds to 1 in
    float32 (a top token of probability 1 - 1e-12): a slot without a filter keeps every
    token and a top-k-only slot exactly k, whether or not a neighbour asked for top-p (the
    batch goes through the filter when any slot asks)."""
    logits = jnp.asarray([[0.0] + [-30.0] * (V - 1)] * 3)
    mask = np.asarray(filter_mask(logits, jnp.asarray([0, 5, 0]), jnp.asarray([1.0, 1.0, 0.9])))
    assert mask[0].all()
    assert mask[1].sum() == 5
    np.testing.assert_array_equal(np.flatnonzero(mask[2]), [0])  # top-p still filters


def test_seed_reproduces_and_small_temperature_approaches_greedy():
    logits = jax.random.normal(jax.random.key(2), (2, V))
    s = _slots([1.0, 1.0], [0, 0], [1.0, 1.0], [11, 12])
    a = [np.asarray(_sample(logits, s, jnp.full(2, p))[0]) for p in range(20)]
    b = [np.asarray(_sample(logits, s, jnp.full(2, p))[0]) for p in range(20)]
    np.testing.assert_array_equal(a, b)
    assert len({tuple(x) for x in a}) > 1
    cold = _slots([1e-3, 1e-3], [0, 0], [1.0, 1.0], [11, 12])
    for p in range(10):
        tok = _sample(logits, cold, jnp.full(2, p))[0]
        np.testing.assert_array_equal(tok, np.argmax(logits, -1))


def test_sampling_params_validation():
    import pytest

    for bad in (dict(temperature=-1), dict(top_p=0.0), dict(top_k=-2), dict(n=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams(stop="x").stop == ("x",)


def test_sampling_params_refuse_non_finite_values():
    """NaN compares False with every bound, so `temperature < 0` let it through and every
    draw was token 0 with a NaN logprob; an infinite temperature (or 1e39, inf in the float32
    slot) sampled uniformly."""
    import pytest

    for temperature in (float("nan"), float("inf"), float("-inf"), 1e39):
        with pytest.raises(ValueError, match="temperature must be finite"):
            SamplingParams(temperature=temperature)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=float("nan"))


def test_top_k_beyond_int32_is_no_filter():
    """top_k >= 2**31 does not fit the int32 slot array (an OverflowError after the model had
    loaded); any k >= V keeps every token, so it samples exactly as top_k = 0 and top_k = V."""
    logits = jax.random.normal(jax.random.key(4), (1, V))
    for huge in (2**31, 2**63 + 5):
        params = SamplingParams(temperature=1.0, top_k=huge, seed=3)
        one = SlotSampling.one(params, seed=3)
        assert int(one.top_k) == np.iinfo(np.int32).max
        filled = SlotSampling.fill(1, params)
        assert int(filled.top_k[0]) == np.iinfo(np.int32).max
        for k_same in (0, V):
            ref = SlotSampling.fill(1, SamplingParams(temperature=1.0, top_k=k_same, seed=3))
            for pos in range(8):
                got = _sample(logits, filled, jnp.asarray([pos]))
                want = _sample(logits, ref, jnp.asarray([pos]))
                for g, w in zip(got, want):  # the same arithmetic: equal to the bit
                    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))

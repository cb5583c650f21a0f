"""Token log-probs and entropy: values vs numpy, chunking == unchunked, memory, stability."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.algorithms as alg
from jaxrl_llm.testing import FLOAT32_EPS, float32_sum_tolerance, log_softmax_tolerance

# under jit: one compile per call instead of one per primitive (keeps the suite fast)
token_logprobs = jax.jit(alg.token_logprobs, static_argnames=("temperature", "chunk_size"))
entropy = jax.jit(alg.entropy, static_argnames=("temperature", "chunk_size"))


def np_log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _exact_and_bounds(logits, tokens, temperature=1.0, logit_error=0.0):
    """float64 (logp of ``tokens``, entropy, d(logp + entropy)/d logits) and the bounds on two
    float32 programs' disagreement on each. With s = x - max x, p = softmax, E = sum p s:
    H = log Z - E errs by log Z's and E's errors (E: V roundings of p s, each term's p and s
    errors) and one subtraction; the gradient (1_y - p - p (s - E)) / T by p's error times
    1 + |s| + |E|, p times s's and E's errors, and 8 roundings of the backward per element."""
    lp, e_lp = log_softmax_tolerance(logits, temperature, logit_error=logit_error)
    s, p = lp - lp.max(-1, keepdims=True), np.exp(lp)
    e_p = p * (e_lp + 2 * FLOAT32_EPS)  # exp: 2 eps more
    mean_s = (p * s).sum(-1, keepdims=True)
    e_mean_s = float32_sum_tolerance(p * s, -1, roundings=s.shape[-1])[..., None]
    e_mean_s += (e_p * np.abs(s) + p * e_lp).sum(-1, keepdims=True)
    ent = -lp.max(-1) - mean_s[..., 0]  # log Z - E
    e_ent = e_lp.min(-1) + e_mean_s[..., 0] + FLOAT32_EPS * np.abs(ent)  # e_lp >= log Z's error
    one_hot = np.eye(s.shape[-1])[np.asarray(tokens)]
    grad = (one_hot - p - p * (s - mean_s)) / temperature
    size = 1 + np.abs(s) + np.abs(mean_s)
    e_grad = e_p * size + p * (e_lp + e_mean_s) + 8 * FLOAT32_EPS * (one_hot + p * size)
    pick = lambda a: np.take_along_axis(a, np.asarray(tokens)[..., None], -1)[..., 0]
    return (pick(lp), ent, grad), (pick(e_lp), e_ent, e_grad / temperature)


def _assert_within(pairs, tol, name):
    """Each pair (float32 programs, float64 values) is within the bound, and the bound is
    rounding: below 1e-4 of the values' scale (the last pair's second), so a 1e-3 bug fails."""
    assert np.max(tol) < 1e-4 * max(1.0, np.max(np.abs(pairs[-1][1]))), name
    for got, want in pairs:
        err = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
        np.testing.assert_array_less(err, tol + 1e-30, err_msg=name)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 7, 11)).astype(np.float32) * 3
    tokens = rng.integers(0, 11, size=(2, 7))
    return logits, tokens


def test_hand_values():
    """Within the float32 bound of the float64 values on the same (float32) logits, which
    are the hand values but for ln 3's rounding: half an ulp, |d logp / dx| <= 1 and
    |dH / dx| = p |s - E| <= 1 here."""
    # logits [0, ln 3] -> probs [1/4, 3/4]
    logits = jnp.array([[[0.0, np.log(3.0)]]])
    (lp, ent, _), (e_lp, e_ent, _) = _exact_and_bounds(logits, [[1]])
    h = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    input_rounding = FLOAT32_EPS / 2 * np.log(3.0)
    assert abs(lp - np.log(0.75)) <= input_rounding and abs(ent - h) <= input_rounding
    _assert_within(((token_logprobs(logits, jnp.array([[1]])), lp),), e_lp, "logp")
    _assert_within(((entropy(logits), ent),), e_ent, "entropy")
    # Uniform: s = 0 exactly, so log Z = ln 8 is one log (2 eps) and p s = 0: H = log Z.
    h8 = entropy(jnp.zeros((1, 1, 8)))
    _assert_within(((h8, [[np.log(8)]]),), 2 * FLOAT32_EPS * np.log(8), "uniform")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [None, 1, 3])  # 3 does not divide T = 7: a remainder
def test_matches_numpy_and_chunking(batch, temperature, chunk_size):
    logits, tokens = batch
    ref = np_log_softmax(logits / temperature)
    expected_lp = np.take_along_axis(ref, tokens[..., None], -1)[..., 0]
    expected_ent = -(np.exp(ref) * ref).sum(-1)
    kw = dict(temperature=temperature, chunk_size=chunk_size)
    lp, ent = jax.jit(lambda lg, tk: (alg.token_logprobs(lg, tk, **kw), alg.entropy(lg, **kw)))(
        jnp.asarray(logits), jnp.asarray(tokens)
    )
    # float32 against float64 on the same logits: within the derived bounds.
    (lp64, ent64, _), (e_lp, e_ent, _) = _exact_and_bounds(logits, tokens, temperature)
    _assert_within(((lp, expected_lp), (lp, lp64)), e_lp, "logp")
    _assert_within(((ent, expected_ent), (ent, ent64)), e_ent, "entropy")


def test_chunked_gradients_equal_unchunked(batch):
    logits, tokens = map(jnp.asarray, batch)
    w = jnp.linspace(-1.0, 1.0, 14).reshape(2, 7)

    def objective(lg, chunk):
        return jnp.sum(w * token_logprobs(lg, tokens, chunk_size=chunk)) + jnp.sum(
            w * entropy(lg, chunk_size=chunk)
        )

    grad = jax.jit(jax.grad(objective), static_argnums=1)
    g_full, g_chunk = grad(logits, None), grad(logits, 3)
    # Two float32 programs (sums over V in other orders): within the bound of each other and
    # of the float64 gradient w (1_y - p - p (s - E)).
    (_, _, exact), (_, _, tol) = _exact_and_bounds(*batch)
    w = np.asarray(w, np.float64)[..., None]
    pairs = ((g_chunk, g_full), (g_chunk, w * exact), (g_full, w * exact))
    _assert_within(pairs, np.abs(w) * tol, "grad")


def test_gradient_sign_raises_chosen_token(batch):
    logits, tokens = map(jnp.asarray, batch)
    g = jax.grad(lambda lg: token_logprobs(lg, tokens).sum())(logits)
    chosen = np.take_along_axis(np.asarray(g), np.asarray(tokens)[..., None], -1)
    assert np.all(chosen > 0)  # d logp_y / d x_y = 1 - p_y > 0
    # 1_y - p sums to 0 exactly: the float32 gradient's sum (taken in float64) errs by its
    # elements' errors, p's (exp of logp's bound, 2 eps more) and the subtraction's.
    lp, e_lp = log_softmax_tolerance(batch[0])
    p = np.exp(lp)
    one_hot = np.eye(p.shape[-1])[batch[1]]
    e_g = p * (e_lp + 2 * FLOAT32_EPS) + FLOAT32_EPS * np.abs(one_hot - p)
    _assert_within(((np.asarray(g, np.float64).sum(-1), 0.0),), e_g.sum(-1), "sum")


def test_large_logits_and_bfloat16_are_finite():
    logits = jnp.array([[[1e4, -1e4, 0.0], [3e4, 3e4, 3e4]]], dtype=jnp.float32)
    lp = token_logprobs(logits, jnp.array([[0, 2]]))
    # Shifted by the max, row 0 is [0, -2e4, -1e4]: exp gives [1, 0, 0] exactly, so
    # log Z = 0, logp = 0 and H = 0 - sum(p s) = 0 exactly; row 1 is [0, 0, 0]: log Z = ln 3
    # (one log, 2 eps), logp = -ln 3 and H = ln 3. A large-logit loss of digits would not fit.
    tol = 2 * FLOAT32_EPS * np.log(3.0) * np.array([[0.0, 1.0]])
    _assert_within(((lp, [[0.0, -np.log(3.0)]]),), tol, "logp")
    _assert_within(((entropy(logits), [[0.0, np.log(3.0)]]),), tol, "entropy")
    bf = jnp.asarray(np.random.default_rng(1).normal(size=(2, 6, 50)) * 20, jnp.bfloat16)
    tok = jnp.zeros((2, 6), jnp.int32)
    for chunk in (None, 4):
        lp, ent = jax.jit(
            lambda x, c=chunk: (token_logprobs(x, tok, chunk_size=c), entropy(x, chunk_size=c))
        )(bf)
        assert lp.dtype == jnp.float32 and np.all(np.isfinite(lp)) and np.all(lp <= 0)
        assert np.all(np.isfinite(ent))
    g = jax.jit(jax.grad(lambda x: token_logprobs(x, tok, chunk_size=4).sum()))(bf)
    assert g.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(g, np.float32)))


def test_chunking_bounds_temporary_memory():
    # Unchunked, the compiled forward holds a shifted float32 copy of the [B, T, V] logits;
    # chunked, temporaries are one [B, chunk, V] block. (float32 logits here: XLA:CPU upcasts
    # whole bf16 arrays before slicing them inside a loop; see the module docstring.)
    b, t, v = 2, 512, 2048
    logits = jax.ShapeDtypeStruct((b, t, v), jnp.float32)
    tokens = jax.ShapeDtypeStruct((b, t), jnp.int32)
    full_copy = b * t * v * 4

    def temp_bytes(chunk):
        fn = lambda lg, tk: token_logprobs(lg, tk, chunk_size=chunk) + entropy(lg, chunk_size=chunk)
        analysis = jax.jit(fn).lower(logits, tokens).compile().memory_analysis()
        if analysis is None:
            pytest.skip("backend reports no memory analysis")
        return analysis.temp_size_in_bytes

    assert temp_bytes(None) >= full_copy  # the test can see the copy
    assert temp_bytes(32) < full_copy / 4


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="do not match"):
        token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))


def test_temperature_may_be_traced(batch):
    logits, tokens = map(jnp.asarray, batch)
    traced = jax.jit(alg.token_logprobs)(logits, tokens, temperature=jnp.float32(0.7))
    static = token_logprobs(logits, tokens, temperature=0.7)
    (lp, _, _), (e_lp, _, _) = _exact_and_bounds(*batch, temperature=0.7)  # two programs
    _assert_within(((traced, static), (traced, lp), (static, lp)), e_lp, "logp")


def _head_case(seed=0, b=3, t=11, d=8, v=17):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, v, (b, t)))
    mask = np.zeros((b, t), np.float32)
    mask[0, 2:7] = 1  # a response
    mask[1, 5] = mask[1, 8:10] = 1  # with a hole (tool output)
    return hidden, w, tokens, jnp.asarray(mask)  # row 2: nothing to train


def _full_head(hidden, w, tokens, mask, temperature):
    logits = hidden @ w
    lp = alg.token_logprobs(logits, tokens, temperature=temperature)
    return lp * mask, alg.entropy(logits, temperature=temperature) * mask


@pytest.mark.slow  # 10 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("chunk_size", [None, 1, 3, 4, 32])
def test_head_logprobs_equal_the_full_logits_path(chunk_size):
    """Values and gradients (hidden states and head weights) at the masked positions, zeros
    elsewhere, for chunks that divide T, leave a remainder, or hold it all."""
    hidden, w, tokens, mask = _head_case()

    def head(h, w):
        return alg.head_logprobs(
            h, tokens, mask, lambda x: x @ w, temperature=0.7, chunk_size=chunk_size,
            entropy="loss",
        )  # fmt: skip

    def objective(fn):
        weights = jnp.linspace(-1.0, 2.0, tokens.size).reshape(tokens.shape)
        return lambda h, w: sum(jnp.sum(weights * x) for x in fn(h, w))

    got = jax.jit(head)(hidden, w)
    want = _full_head(hidden, w, tokens, mask, 0.7)
    # Two float32 programs (the logits' D-sum and the V-sums in other orders): within the
    # bound of each other and of float64, the logits' error carried into the log-softmax.
    h64, w64, m64 = (np.asarray(x, np.float64) for x in (hidden, w, mask))
    terms = h64[..., None] * w64  # [B, T, D, V]
    exact, tols = _exact_and_bounds(h64 @ w64, tokens, 0.7, float32_sum_tolerance(terms, -2))
    for name, g, e, x, tol in zip(("logp", "entropy"), got, want, exact, tols):
        _assert_within(((g, e), (g, x * m64), (e, x * m64)), tol * m64, name)
        assert np.all(np.asarray(g)[np.asarray(mask) == 0] == 0)
    full = lambda h, w: _full_head(h, w, tokens, mask, 0.7)
    g_chunk = jax.jit(jax.grad(objective(head), argnums=(0, 1)))(hidden, w)
    g_full = jax.grad(objective(full), argnums=(0, 1))(hidden, w)
    # d/dh = G w^T (a sum over V), d/dw = h^T G (over the masked positions: adding the others'
    # exact zeros rounds nothing), G = c * grad with c = weights * mask.
    c = np.linspace(-1.0, 2.0, tokens.size).reshape(tokens.shape)[..., None] * m64[..., None]
    grad_g, e_g = c * exact[2], np.abs(c) * tols[2]
    e_h = float32_sum_tolerance(grad_g[..., None, :] * w64, -1) + e_g @ np.abs(w64.T)
    d_h = (grad_g @ w64.T, e_h)
    on = m64 > 0
    d_w = (
        np.einsum("btd,btv->dv", h64, grad_g),
        float32_sum_tolerance(h64[on][:, :, None] * grad_g[on][:, None], roundings=on.sum() - 1)
        + np.einsum("btd,btv->dv", np.abs(h64), e_g),
    )
    for name, a, b, (x, tol) in zip(("d_hidden", "d_w"), g_chunk, g_full, (d_h, d_w)):
        _assert_within(((a, b), (a, x), (b, x)), tol, name)


@pytest.mark.slow  # 8 s in a loaded 2-worker run, AMD EPYC AVX2
def test_head_logprobs_entropy_modes():
    hidden, w, tokens, mask = _head_case(1)
    run = lambda mode: alg.head_logprobs(hidden, tokens, mask, lambda x: x @ w, entropy=mode)
    lp_off, ent_off = run("off")
    lp_metric, ent_metric = run("metric")
    assert ent_off is None and ent_metric is not None
    # Two programs and the float64 values: the bounds of `test_head_logprobs_equal_the_full_
    # logits_path` (the logits' D-sum error carried into the log-softmax).
    h64, w64, m64 = (np.asarray(x, np.float64) for x in (hidden, w, mask))
    terms = h64[..., None] * w64  # [B, T, D, V]
    exact, tols = _exact_and_bounds(h64 @ w64, tokens, 1.0, float32_sum_tolerance(terms, -2))
    full_ent = _full_head(hidden, w, tokens, mask, 1.0)[1]
    lp64, ent64 = exact[0] * m64, exact[1] * m64
    _assert_within(((lp_off, lp_metric), (lp_off, lp64), (lp_metric, lp64)), tols[0] * m64, "lp")
    _assert_within(((ent_metric, full_ent), (ent_metric, ent64)), tols[1] * m64, "entropy")
    # "metric": the value without a gradient; "loss": with it.
    grad = lambda mode: jax.grad(
        lambda w: jnp.sum(alg.head_logprobs(hidden, tokens, mask, lambda x: x @ w, entropy=mode)[1])
    )(w)
    assert np.all(np.asarray(grad("metric")) == 0)
    assert np.any(np.asarray(grad("loss")) != 0)


def test_head_logprobs_run_the_head_only_on_chunks_with_masked_positions():
    """The masked positions of each row move to the front: with at most 5 per row and
    chunks of 2, 3 of the 6 chunks run the head; a mask of one token runs one chunk."""
    hidden, w, tokens, mask = _head_case(b=3, t=12)
    calls = []

    def head(x):
        jax.debug.callback(lambda: calls.append(1))
        return x @ w

    fn = jax.jit(lambda m: alg.head_logprobs(hidden, tokens, m, head, chunk_size=2)[0])
    jax.block_until_ready(fn(mask))
    jax.effects_barrier()
    assert len(calls) == 3
    calls.clear()
    jax.block_until_ready(fn(jnp.zeros_like(mask).at[2, 11].set(1.0)))
    jax.effects_barrier()
    assert len(calls) == 1


def test_head_logprobs_bound_the_logits_memory():
    """Chunked, the compiled forward and backward hold a few [B, chunk, V] blocks (logits,
    their softmax, their gradient), never the [B, T, V] logits of the whole batch."""
    b, t, d, v = 2, 512, 16, 2048
    hidden = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    tokens = jax.ShapeDtypeStruct((b, t), jnp.int32)
    mask = jax.ShapeDtypeStruct((b, t), jnp.float32)

    def temp_bytes(chunk):
        def loss(h, w, tk, m):
            lp, ent = alg.head_logprobs(h, tk, m, lambda x: x @ w, chunk_size=chunk, entropy="loss")
            return jnp.sum(lp) + jnp.sum(ent)

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, w, tokens, mask).compile()
        analysis = compiled.memory_analysis()
        if analysis is None:
            pytest.skip("backend reports no memory analysis")
        return analysis.temp_size_in_bytes

    full_logits, block = b * t * v * 4, b * 32 * v * 4
    unchunked = temp_bytes(None)
    assert unchunked >= full_logits  # the test can see the logits
    assert temp_bytes(32) < min(8 * block, unchunked / 8)


def test_head_logprobs_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="hidden"):
        alg.head_logprobs(jnp.zeros((2, 3, 4)), jnp.zeros((2, 4), jnp.int32),
                          jnp.zeros((2, 4)), lambda x: x)  # fmt: skip

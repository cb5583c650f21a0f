"""Token log-probs and entropy: values vs numpy, chunking == unchunked, memory, stability."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.algorithms as alg

# under jit: one compile per call instead of one per primitive (keeps the suite fast)
token_logprobs = jax.jit(alg.token_logprobs, static_argnames=("temperature", "chunk_size"))
entropy = jax.jit(alg.entropy, static_argnames=("temperature", "chunk_size"))


def np_log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 7, 11)).astype(np.float32) * 3
    tokens = rng.integers(0, 11, size=(2, 7))
    return logits, tokens


def test_hand_values():
    # logits [0, ln 3] -> probs [1/4, 3/4]
    logits = jnp.array([[[0.0, np.log(3.0)]]])
    np.testing.assert_allclose(
        token_logprobs(logits, jnp.array([[1]])), [[np.log(0.75)]], rtol=1e-6
    )
    h = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    np.testing.assert_allclose(entropy(logits), [[h]], rtol=1e-6)
    np.testing.assert_allclose(entropy(jnp.zeros((1, 1, 8))), [[np.log(8)]], rtol=1e-6)


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
    np.testing.assert_allclose(lp, expected_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, expected_ent, rtol=1e-5, atol=1e-5)


def test_chunked_gradients_equal_unchunked(batch):
    logits, tokens = map(jnp.asarray, batch)
    w = jnp.linspace(-1.0, 1.0, 14).reshape(2, 7)

    def objective(lg, chunk):
        return jnp.sum(w * token_logprobs(lg, tokens, chunk_size=chunk)) + jnp.sum(
            w * entropy(lg, chunk_size=chunk)
        )

    grad = jax.jit(jax.grad(objective), static_argnums=1)
    g_full, g_chunk = grad(logits, None), grad(logits, 3)
    np.testing.assert_allclose(g_chunk, g_full, rtol=1e-5, atol=1e-6)


def test_gradient_sign_raises_chosen_token(batch):
    logits, tokens = map(jnp.asarray, batch)
    g = jax.grad(lambda lg: token_logprobs(lg, tokens).sum())(logits)
    chosen = np.take_along_axis(np.asarray(g), np.asarray(tokens)[..., None], -1)
    assert np.all(chosen > 0)  # d logp_y / d x_y = 1 - p_y > 0
    np.testing.assert_allclose(np.asarray(g).sum(-1), 0.0, atol=1e-5)


def test_large_logits_and_bfloat16_are_finite():
    logits = jnp.array([[[1e4, -1e4, 0.0], [3e4, 3e4, 3e4]]], dtype=jnp.float32)
    lp = token_logprobs(logits, jnp.array([[0, 2]]))
    np.testing.assert_allclose(lp, [[0.0, -np.log(3.0)]], atol=1e-5)
    np.testing.assert_allclose(entropy(logits), [[0.0, np.log(3.0)]], atol=1e-5)
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
    np.testing.assert_allclose(traced, token_logprobs(logits, tokens, temperature=0.7), rtol=1e-6)

"""Full-forward attention (`models.self_attention`): the segment mask, the causal query blocks
and the Pallas splash kernel (interpret mode on CPU) agree in values and gradients, with
padding, packed segments, GQA, rows not a multiple of the kernel's block, and under a mesh.

Float32 results are compared by `testing.assert_as_accurate`: each path must be as close to
the float64 run of the dense XLA path as that path's float32 run is (issue #26: no fixed
tolerance, which XLA:CPU's per-host summation orders break)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.self_attention import (
    Segments,
    attend,
    causal_attend,
    self_attend,
    splash_attend,
    splash_supported,
)
from jaxrl_llm.models.transformer import CausalLM
from jaxrl_llm.sharding import TRAIN_RULES, build_mesh
from jaxrl_llm.sharding.rules import ShardingContext
from jaxrl_llm.testing import as_float64, assert_as_accurate, float64_twin, jitted


def _inputs(T, seed=0, B=2, N=4, K=2, H=8):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(ks[0], (B, T, N, H))
    k = jax.random.normal(ks[1], (B, T, K, H))
    v = jax.random.normal(ks[2], (B, T, K, H))
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, T), size=(B, 3), replace=False), axis=1)
    segments = np.stack([np.searchsorted(c, np.arange(T), side="right") + 1 for c in cuts])
    segments[:, -7:] = 0  # trailing padding
    return q, k, v, Segments(jnp.asarray(segments, jnp.int32))


def _grads(f, q, k, v, seed=9):
    w = jax.random.normal(jax.random.PRNGKey(seed), q.shape, jnp.float32).astype(q.dtype)
    return jax.jit(jax.grad(lambda *x: jnp.sum(f(*x) * w), argnums=(0, 1, 2)))(q, k, v)


def _float64(fn, *arrays):
    """`fn` on float32 `arrays` upcast to float64 (`testing.as_float64`), under x64: numpy
    leaves out."""
    with jax.enable_x64(True):
        return jax.tree.map(np.asarray, jax.jit(fn)(*as_float64(arrays)))


def test_segments_mask_is_causal_same_sequence_and_hides_padding():
    attention_mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    segment_ids = jnp.array([[1, 1, 1, 1, 1], [1, 1, 2, 2, 0]])
    ids = Segments.of(attention_mask, segment_ids, (2, 5)).ids
    np.testing.assert_array_equal(ids, [[0, 0, 1, 1, 1], [1, 1, 2, 2, 0]])
    dense = np.asarray(Segments(ids).dense())
    tril = np.tril(np.ones((5, 5), bool))
    for b in range(2):
        idb = np.asarray(ids[b])
        want = tril & (idb[:, None] == idb[None, :])
        np.testing.assert_array_equal(dense[b], want)
        real = idb > 0  # real tokens attend real tokens of their own sequence only
        assert not dense[b][np.ix_(real, ~real)].any()
    assert dense.any(axis=-1).all()  # no empty row: every token attends itself
    np.testing.assert_array_equal(Segments.of(None, None, (1, 3)).ids, [[1, 1, 1]])


@pytest.mark.slow  # 4-10 s each in a 2-worker run, AMD EPYC AVX2, jitted (2026-12-05)
@pytest.mark.parametrize("T,block", [(100, 32), (97, 32), (64, 64), (40, 64)])
def test_causal_blocks_equal_dense_attention_and_gradients(T, block):
    q, k, v, segments = _inputs(T)
    dense = jax.jit(lambda q, k, v: attend(q, k, v, segments.dense(), 0.3))
    blocked = jax.jit(lambda q, k, v: causal_attend(q, k, v, segments, 0.3, block=block))
    # trusted: dense float32; exact: dense float64 (values, then gradients)
    assert_as_accurate(blocked(q, k, v), dense(q, k, v), _float64(dense, q, k, v))
    exact = _float64(lambda *x: _grads(dense, *x), q, k, v)
    assert_as_accurate(_grads(blocked, q, k, v), _grads(dense, q, k, v), exact)


@pytest.mark.slow  # 4-6 s each alone, AMD EPYC AVX2, jitted (2026-12-05)
@pytest.mark.parametrize("T,N,K", [(150, 4, 2), (128, 2, 2), (40, 6, 3)])
def test_splash_kernel_equals_xla_values_and_gradients(T, N, K):
    """Interpret mode on CPU; 150 and 40 tokens are padded to the kernel's block inside."""
    q, k, v, segments = _inputs(T, seed=T, N=N, K=K, H=16)
    xla = jax.jit(lambda q, k, v: causal_attend(q, k, v, segments, 0.25))
    kernel = jax.jit(lambda q, k, v: splash_attend(q, k, v, segments, 0.25, None))
    # trusted: XLA float32; exact: XLA float64 (values, then gradients)
    assert_as_accurate(kernel(q, k, v), xla(q, k, v), _float64(xla, q, k, v))
    exact = _float64(lambda *x: _grads(xla, *x), q, k, v)
    # factor 8: the kernel's backward is another formula, not another order (probabilities
    # recomputed as exp(s - logsumexp) in float32, di = sum(o do) from the rounded output):
    # its dq errs up to 2.6x XLA's at the worst element (T = 150; the same formula in dense
    # float32 JAX reproduces its dq errors exactly at T = 128 and 40)
    assert_as_accurate(_grads(kernel, q, k, v), _grads(xla, q, k, v), exact, factor=8.0)


def test_a_kernel_first_built_inside_a_trace_serves_later_programs():
    """The splash kernel is cached across programs (`self_attention._kernel`); built while a
    jitted step traces, it must hold no tracer: the next program using it raised
    `UnexpectedTracerError` (found when these tests were first jitted)."""
    from jaxrl_llm.models import self_attention

    self_attention._kernel.cache_clear()
    q, k, v, segments = _inputs(16, seed=1, B=1, N=2, K=1, H=16)
    first = jax.jit(lambda q, k, v: splash_attend(q, k, v, segments, 0.25, None))(q, k, v)
    twice = jax.jit(lambda q, k, v: 2.0 * splash_attend(q, k, v, segments, 0.25, None))(q, k, v)
    np.testing.assert_array_equal(twice, 2.0 * first)


@pytest.mark.slow  # 18 s in a loaded 2-worker run, AMD EPYC AVX2
def test_splash_under_a_mesh_splits_rows_and_head_groups():
    """Rows over fsdp, kv heads (and their query heads) over tensor, per device."""
    mesh = build_mesh(data=1, fsdp=4, tensor=2)
    ctx = ShardingContext(mesh, TRAIN_RULES)
    q, k, v, segments = _inputs(64, seed=3, B=4, N=8, K=2, H=16)
    want = causal_attend(q, k, v, segments, 0.25)
    got = jax.jit(lambda q, k, v, ids: splash_attend(q, k, v, Segments(ids), 0.25, ctx))(
        q, k, v, segments.ids
    )
    exact = _float64(lambda q, k, v: causal_attend(q, k, v, segments, 0.25), q, k, v)
    assert_as_accurate(got, want, exact)  # trusted: XLA float32; exact: XLA float64


@pytest.mark.slow  # 18 s in a 2-worker run, AMD EPYC AVX2, jitted (2026-12-05)
def test_auto_uses_xla_off_tpu_and_model_logits_agree_across_impls():
    q, k, v, segments = _inputs(32)
    assert not splash_supported(q, k)
    assert not splash_supported(q, k, platform="tpu")  # head_dim 8: not a lane multiple
    np.testing.assert_array_equal(
        self_attend(q, k, v, segments, 0.3, "auto"), causal_attend(q, k, v, segments, 0.3)
    )
    cfg = ModelConfig(num_layers=2, vocab_size=64)
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 24), 0, 64)
    mask = jnp.ones((2, 24), jnp.int32).at[1, :5].set(0)
    xla, splash = (CausalLM(cfg.replace(attention=a), rngs=nnx.Rngs(0)) for a in ("xla", "splash"))
    forward = jitted()
    with jax.enable_x64(True):
        exact = forward(float64_twin(xla), ids, attention_mask=mask)
    # trusted: the XLA model's float32 logits; exact: its float64 twin's
    assert_as_accurate(
        forward(splash, ids, attention_mask=mask), forward(xla, ids, attention_mask=mask), exact
    )
    with pytest.raises(ValueError, match=r"ModelConfig\.attention"):
        ModelConfig(attention="flash")

"""The int8 CPU kernel (`models.int8_cpu`, `models/int8_matmul.cc`): its products equal
their formula within float32's summation bound, it is in the program only where it should
be, gradients through it are XLA's, its AVX-512 path sums as its AVX2 path bit for bit, it
runs on 8 simulated devices, and a failed build leaves XLA's product in place with one
warning."""

import itertools
import logging
import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.models import int8_cpu
from jaxrl_llm.testing import assert_as_accurate

pytestmark = pytest.mark.skipif(
    int8_cpu.target_name() is None, reason="no C++ compiler: the kernel cannot be built"
)
U = 2.0**-24  # float32's unit roundoff


@pytest.fixture(autouse=True)
def _small_weights_too(monkeypatch):
    """The kernel for weights of any size (its threshold keeps small ones on XLA)."""
    monkeypatch.setattr(int8_cpu, "MIN_WEIGHT_ELEMENTS", 0)


def _operands(R: int, K: int, N: int, transposed: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((R, K)).astype(np.float32)
    q = rng.integers(-127, 128, (N, K) if transposed else (K, N), dtype=np.int8)
    s = (rng.random(N) * 1e-2 + 1e-4).astype(np.float32)
    return x, q, s


def _xla(transposed: bool):
    spec = "rk,nk->rn" if transposed else "rk,kn->rn"
    return lambda x, q, s: jnp.einsum(spec, x, q.astype(x.dtype)) * s.astype(x.dtype)


def _exact_and_bound(x, q, s, transposed: bool):
    """The product in float64 and float32's bound on a K-term sum's error (Higham: |error|
    <= gamma_K sum |x_k w_k|, gamma_K ~ K u), plus the scale multiply's rounding."""
    w = np.asarray(q, np.float64)
    w = w.T if transposed else w
    x64, s64 = np.asarray(x, np.float64), np.asarray(s, np.float64)
    exact = (x64 @ w) * s64
    bound = (x.shape[1] + 2) * U * (np.abs(x64) @ np.abs(w)) * s64
    return exact, bound


def _product(transposed: bool):
    xla = _xla(transposed)
    return jax.jit(lambda x, q, s: int8_cpu.int8_matmul(x, q, s, xla, transposed=transposed))


@pytest.mark.parametrize(
    ("R", "K", "N", "transposed"),
    [(1, 896, 4864, False), (3, 4864, 896, False), (16, 37, 13, False), (2, 3, 5, False),
     (5, 300, 1001, False), (1, 896, 1000, True), (2, 37, 13, True), (5, 19, 7, True),
     (16, 64, 300, True)],
)  # fmt: skip
def test_the_kernel_is_its_formula_within_float32s_summation_bound(R, K, N, transposed):
    """Layouts [K, N] and [N, K], one row to `MAX_ROWS`, sizes that leave every vector loop
    a remainder, and a weight large enough to be split over the thread pool."""
    x, q, s = _operands(R, K, N, transposed)
    f = _product(transposed)
    assert "jaxrl_int8_matmul" in f.lower(x, q, s).as_text()
    got = np.asarray(f(x, q, s), np.float64)
    exact, bound = _exact_and_bound(x, q, s, transposed)
    assert got.shape == (R, N)
    assert np.all(np.abs(got - exact) <= bound), np.max(np.abs(got - exact) / bound)


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the AVX2 and AVX-512 paths are x86's (and -mno-avx512f an x86 compiler flag)",
)
def test_the_avx512_path_sums_as_the_avx2_path_bit_for_bit():
    """Built for this host (`-march=native`) and again with `-mno-avx512f` (the AVX2 path):
    the same outputs bit for bit, one row to `MAX_ROWS`, widths that leave 16-, 8- and
    1-column tails, both layouts and weights split over the thread pool. On a host with
    AVX-512 the first build runs 16 lanes at a time (`int8_matmul.cc`); on one without, both
    builds are the AVX2 path."""
    avx512 = "avx512f" in int8_cpu._cpu_identity().split()  # for the failure message
    cxx = int8_cpu._compiler()
    assert cxx is not None  # the module's skip: the kernel built
    avx2 = int8_cpu.register(int8_cpu._build(cxx, ("-mno-avx512f",)), "jaxrl_int8_test_avx2")
    native = int8_cpu.target_name()
    shapes = itertools.product([1, 3, 16], [36, 900], [24, 40, 1000], [False, True])
    for R, K, N, transposed in shapes:
        x, q, s = _operands(R, K, N, transposed)
        out = jax.ShapeDtypeStruct((R, N), jnp.float32)
        got = [np.asarray(jax.ffi.ffi_call(name, out)(x, q, s, transposed=transposed))
               for name in (native, avx2)]  # fmt: skip
        assert np.array_equal(got[0].view(np.int32), got[1].view(np.int32)), (
            R, K, N, transposed, avx512)  # fmt: skip


def test_the_kernel_is_in_the_program_only_where_it_pays(monkeypatch):
    """`MAX_ROWS` rows take the kernel, one more row, float64 activations or a weight under
    `MIN_WEIGHT_ELEMENTS` XLA's product, and `JAXRL_LLM_INT8_KERNEL=0` none (read at trace
    time)."""
    n = int8_cpu.MAX_ROWS
    x, q, s = _operands(n + 1, 16, 8, False)
    xla = _xla(False)

    def lowered(x):
        return jax.jit(lambda x: int8_cpu.int8_matmul(x, q, s, xla)).lower(x).as_text()

    assert "jaxrl_int8_matmul" in lowered(x[:n])
    assert "jaxrl_int8_matmul" not in lowered(x)
    with jax.enable_x64(True):
        assert "jaxrl_int8_matmul" not in lowered(np.asarray(x[:n], np.float64))
    monkeypatch.setattr(int8_cpu, "MIN_WEIGHT_ELEMENTS", q.size + 1)
    assert "jaxrl_int8_matmul" not in lowered(x[:n])
    monkeypatch.setattr(int8_cpu, "MIN_WEIGHT_ELEMENTS", q.size)
    assert "jaxrl_int8_matmul" in lowered(x[:n])
    monkeypatch.setenv(int8_cpu.ENV_SWITCH, "0")
    assert "jaxrl_int8_matmul" not in lowered(x[:n])


@pytest.mark.parametrize("transposed", [False, True])
def test_gradients_through_the_kernel_are_xlas(transposed):
    """d/dx and d/ds of a loss through the kernel are as accurate as those through XLA's
    product against the float64 gradients (`testing.assert_as_accurate`): the JVP is XLA's
    (the kernel has no derivative of its own); only the forward's rounding differs."""
    x, q, s = _operands(4, 40, 24, transposed)
    xla = _xla(transposed)

    def loss(product, x, s):
        return jnp.sum(jnp.sin(product(x, q, s)))

    def grads(product):
        return jax.jit(jax.grad(lambda x, s: loss(product, x, s), argnums=(0, 1)))(x, s)

    kernel = lambda x, q, s: int8_cpu.int8_matmul(x, q, s, xla, transposed=transposed)
    got, want = grads(kernel), grads(xla)
    with jax.enable_x64(True):  # the same gradients in float64: XLA's product only
        x, s = np.asarray(x, np.float64), np.asarray(s, np.float64)
        exact = grads(xla)
    assert_as_accurate(got, want, exact)


def test_sharded_operands_on_eight_devices():
    """On the test session's 8 simulated CPU devices, rows and the weight split over them
    (FSDP-like), the product equals the one-device kernel's to float32 summation."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    x, q, s = _operands(8, 64, 32, False)
    f = _product(False)
    placed = [jax.device_put(a, NamedSharding(mesh, PartitionSpec("d")))
              for a in (x, q, s)]  # fmt: skip
    assert "jaxrl_int8_matmul" in f.lower(*placed).as_text()
    got = np.asarray(f(*placed), np.float64)
    exact, bound = _exact_and_bound(x, q, s, False)
    assert np.all(np.abs(got - exact) <= bound)


def test_a_failed_build_warns_and_leaves_xlas_product(monkeypatch, tmp_path, caplog):
    """A compiler that fails: one warning naming the kernel, `target_name` None, and the
    product is XLA's (no custom call in the program), equal to it bit for bit."""
    bad = tmp_path / "c++"
    bad.write_text("#!/bin/sh\necho 'no such compiler today' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("CXX", str(bad))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    int8_cpu.target_name.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=int8_cpu.__name__):
            assert int8_cpu.target_name() is None
        assert any("did not build" in r.getMessage() for r in caplog.records)
        x, q, s = _operands(2, 16, 8, False)
        xla = _xla(False)
        f = jax.jit(lambda x: int8_cpu.int8_matmul(x, q, s, xla))
        assert "jaxrl_int8_matmul" not in f.lower(x).as_text()
        np.testing.assert_array_equal(f(x), jax.jit(lambda x: xla(x, q, s))(x))
    finally:
        int8_cpu.target_name.cache_clear()  # the next test builds (or loads) the real one

"""Weight-only int8 products for few rows on the CPU: a kernel of our own (`int8_matmul.cc`
beside this file, an XLA FFI handler) where XLA:CPU has none.

XLA:CPU converts an int8 weight to float before a product with float activations (a whole
[K, N] float temporary per product and step), so the sampler's weight-only int8 copy
(`RolloutConfig.weights = "int8"`) decoded slower than float32 (0.40x at batch 1 on the
Qwen2.5-0.5B shape). The kernel converts 8 weights at a time in registers and uses them
at once, so a decode step reads each weight byte once; its accumulation order differs
from XLA's dot, its inputs and formula do not: y = (x W_q) * s.

`int8_matmul` uses it when all of these hold, decided at trace time (else the caller's XLA
product, as before): the program lowers for the CPU (`lax.platform_dependent`: a program
lowered for a GPU or TPU never contains the call); at most `MAX_ROWS` rows (decoding;
prefill is compute-bound and XLA's dot is the better tool there); a weight of at least
`MIN_WEIGHT_ELEMENTS` (a smaller one costs XLA less to convert); activations of 32 bits
or fewer; the default backend is the CPU (a GPU or TPU host builds nothing);
`JAXRL_LLM_INT8_KERNEL` is not "0"; and the kernel built. On a multi-device CPU
mesh (simulated devices) the call has no sharding rule: XLA gives it whole operands, as
it gathers an FSDP weight for a dot.

Built on first use with the host's C++ compiler (`$CXX`, else `c++`) for the host's own
instruction set (`-march=native`: AVX2 + FMA paths where the CPU has them, the same sums
16 lanes at a time where it has AVX-512 too, bit for bit the AVX2 path's results), into
`$XDG_CACHE_HOME/jaxrl-llm/kernels` (else `~/.cache/...`) under a name derived from the
source, the compiler, jaxlib's version and the CPU's model and flags, so a home shared by
hosts of other CPUs never loads a library built for another instruction set. About 4 s,
once per host. No compiler, or a failed build: one warning, and XLA's product is used.
Gradients: the JVP is the caller's XLA product's, so reverse mode through the kernel (an
int8 LoRA base) is XLA's transpose of that.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.user_cache import user_cache_dir

log = logging.getLogger(__name__)
Array = jax.Array
Product = Callable[[Array, Array, Array], Array]

MAX_ROWS = 16  # products of more rows keep XLA's dot (see docs/performance.md)
# Smaller weights keep XLA's dot too: converting them costs less than a call of the kernel
# (the shipped tiny model, weights of 33K-49K elements, at batch 8: 0.89x float32 by XLA,
# 0.69x by the kernel). Qwen2.5-0.5B's smallest, k_proj and v_proj (115K elements), take
# the kernel, as every weight of that shape does (docs/performance.md).
MIN_WEIGHT_ELEMENTS = 1 << 16
ENV_SWITCH = "JAXRL_LLM_INT8_KERNEL"  # "0": never use the kernel
SOURCE = Path(__file__).with_name("int8_matmul.cc")
_SYMBOL = "JaxrlInt8Matmul"
BUILD_TIMEOUT_S = 300


def _cpu_identity() -> str:
    """The CPU's model and feature flags (Linux), else the machine name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    keep = [x for x in lines if x.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(keep)) or platform.machine()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def _build(cxx: str, flags: tuple[str, ...] = ()) -> Path:
    """The kernel's shared library for this host, compiled unless already in the cache.
    `flags` are added to the compiler's (a test builds the AVX2 path on an AVX-512 host with
    `-mno-avx512f`)."""
    version = subprocess.run(
        [cxx, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    parts = [SOURCE.read_text(), version, jax.lib.__version__, _cpu_identity(), *flags]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    out = Path(user_cache_dir("kernels")) / f"int8_matmul-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w",
           *flags, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", tmp]  # fmt: skip
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=True)
        os.replace(tmp, out)  # atomic: a concurrent build writes the same bytes
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


@functools.cache
def target_name() -> str | None:
    """The registered FFI target's name, building and loading the kernel on first call; None
    where it cannot be built (one warning says why)."""
    cxx = _compiler()
    if cxx is None:
        log.warning("no C++ compiler ($CXX / c++ / g++): int8 products use XLA's dot")
        return None
    name = "jaxrl_int8_matmul_" + hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:8]
    try:
        return register(_build(cxx), name)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        log.warning("the int8 CPU kernel did not build (%s): XLA's dot is used", detail[-2000:])
        return None


def register(library: Path, name: str) -> str:
    """Loads a built kernel library and registers its handler as the CPU FFI target `name`."""
    lib = ctypes.cdll.LoadLibrary(str(library))
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, _SYMBOL)), platform="cpu")
    return name


def _kernel(x: Array, q: Array, scale: Array, transposed: bool, dtype: jnp.dtype) -> Array:
    """The kernel's product for x [..., K] (the leading dims merged into rows and split
    after), in `dtype`."""
    name = target_name()
    assert name is not None  # `int8_matmul` checked
    n = q.shape[0] if transposed else q.shape[1]
    rows = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    out = jax.ShapeDtypeStruct((rows.shape[0], n), jnp.float32)
    call = jax.ffi.ffi_call(name, out, vmap_method="sequential")
    y = call(rows, q, scale.astype(jnp.float32), transposed=transposed)
    return y.reshape(*x.shape[:-1], n).astype(dtype)


def usable(rows: int, weight_elements: int, dtype: Any = jnp.float32) -> bool:
    """Whether a product of `rows` rows of `dtype` with a weight of `weight_elements` takes
    the kernel on a CPU (module docstring; float64, a reference run's, keeps XLA's product:
    the kernel sums float32)."""
    if rows > MAX_ROWS or weight_elements < MIN_WEIGHT_ELEMENTS or jnp.dtype(dtype).itemsize > 4:
        return False
    if os.environ.get(ENV_SWITCH) == "0":
        return False
    if jax.default_backend() != "cpu":  # a GPU or TPU host: nothing to build
        return False
    return target_name() is not None


def int8_matmul(
    x: Array, q: Array, scale: Array, xla: Product, *, transposed: bool = False
) -> Array:
    """(x W_q) * s for x [..., K], W_q int8 [K, N] (or [N, K] with `transposed`) and s [N]:
    the kernel where `usable` (x's leading dims counted as rows) and the program runs on a
    CPU, else `xla(x, q, scale)`, the caller's own XLA form of the same product (its dtype is
    the result's; its derivative is the kernel's). Not `usable`: `xla`'s product, as if the
    kernel did not exist."""
    if not usable(math.prod(x.shape[:-1]), q.size, x.dtype):
        return xla(x, q, scale)
    dtype = jax.eval_shape(xla, x, q, scale).dtype

    @jax.custom_jvp
    def product(x: Array, q: Array, scale: Array) -> Array:
        cpu = functools.partial(_kernel, transposed=transposed, dtype=dtype)
        return jax.lax.platform_dependent(x, q, scale, cpu=cpu, default=xla)

    @product.defjvp
    def _(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
        return product(*primals), jax.jvp(xla, primals, tangents)[1]

    return product(x, q, scale)

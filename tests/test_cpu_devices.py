"""The CPU client's pool is sized so that collectives of simulated devices cannot deadlock."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxrl_llm import cpu_devices

# Chains N programs with an all-gather on 8 simulated devices from T Python threads, without
# waiting: the host runs far past the 32 programs a device may have in flight. With the
# client's default pool (8 threads on a small machine) this aborts in XLA's rendezvous every
# time (docs/testing.md); a short rendezvous limit makes a regression fail in seconds.
_CHAIN = textwrap.dedent(
    """
    import sys, threading
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    n, threads = int(sys.argv[1]), int(sys.argv[2])
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    rows = NamedSharding(mesh, P("d"))

    @jax.jit
    def step(x):
        full = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P()))  # all-gather
        for _ in range(20):
            x = jnp.tanh(x @ jnp.eye(x.shape[1]) + full.mean())
        return x

    def chain():
        x = jax.device_put(np.ones((8 * 64, 256), np.float32), rows)
        for _ in range(n):
            x = step(x)
        x.block_until_ready()

    workers = [threading.Thread(target=chain) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print("done", jax.device_count(), flush=True)
    """
)


@pytest.mark.slow  # 13 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("threads", [1, cpu_devices.DISPATCH_THREADS])
def test_chained_collective_programs_never_deadlock(threads):
    env = dict(os.environ)  # the suite's: 8 devices and the pool conftest sized
    env["XLA_FLAGS"] += " --xla_cpu_collective_call_terminate_timeout_seconds=10"
    assert int(env["PJRT_NPROC"]) >= cpu_devices.pool_threads(8, threads)
    out = subprocess.run(
        [sys.executable, "-c", _CHAIN, "100", str(threads)],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["done", "8"]


def test_pool_size_follows_the_simulated_device_count():
    env = {"XLA_FLAGS": "--foo --xla_force_host_platform_device_count=4"}
    assert cpu_devices.simulated_device_count(env) == 4
    assert cpu_devices.size_thread_pool(env) == 4 * (1 + cpu_devices.DISPATCH_THREADS)
    assert env["PJRT_NPROC"] == "16"
    assert cpu_devices.size_thread_pool(env) is None  # already large enough


def test_pool_size_is_raised_never_lowered():
    small = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "2"}
    assert cpu_devices.size_thread_pool(small) == 32 and small["PJRT_NPROC"] == "32"
    big = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "64"}
    assert cpu_devices.size_thread_pool(big) is None and big["PJRT_NPROC"] == "64"
    one = {"XLA_FLAGS": "", "NPROC": "2"}
    assert cpu_devices.size_thread_pool(one) is None and "PJRT_NPROC" not in one


def test_the_cli_sizes_the_pool_before_jax_starts(monkeypatch):
    from jaxrl_llm import cli

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    monkeypatch.setenv("PJRT_NPROC", "1")
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    assert os.environ["PJRT_NPROC"] == str(cpu_devices.pool_threads(2))

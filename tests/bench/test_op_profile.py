"""`bench.op_profile`: a traced call's op time, joined to the source lines that emitted it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.bench.op_profile import _self_times, profile_call


def _dense_then_tanh(x, w):
    return jnp.tanh(x @ w).sum()


def test_a_matmul_is_found_at_its_source_function():
    x = jnp.asarray(np.random.RandomState(0).randn(256, 512), jnp.float32)
    w = jnp.asarray(np.random.RandomState(1).randn(512, 512), jnp.float32)
    prof = profile_call(jax.jit(_dense_then_tanh), x, w)
    assert prof.total_ms > 0 and prof.mapped_share > 0.9
    kinds = {(k, f) for k, f, _ in prof.by_function}
    assert ("matmul", "test_op_profile.py:_dense_then_tanh") in kinds
    assert sum(prof.by_kind.values()) == pytest.approx(prof.total_ms)
    out = prof.to_json(top=1)
    assert len(out["by_function"]) == 1 and out["by_kind"]["matmul"]["ms"] > 0


def test_self_time_excludes_nested_events_of_the_same_thread_only():
    ev = lambda name, ts, dur, tid: {"name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    events = [
        ev("loop", 0, 100, 1),
        ev("body_op", 10, 30, 1),
        ev("body_op", 50, 20, 1),
        ev("other_thread", 5, 50, 2),  # overlaps in time, another thread: not nested
        ev("after", 100, 5, 1),  # starts where the loop ends: not nested
    ]
    got = _self_times(events)
    assert got == {"loop": 50, "body_op": 50, "other_thread": 50, "after": 5}


def test_op_events_count_each_loop_iteration():
    """A loop body's ops are timed once per iteration: `op_events` of a 5-iteration loop
    exceeds that of a 1-iteration one by 4 x the body's ops (what `bench rollout --profile`
    divides by the decode steps to give ops per step)."""

    def loop(n):
        def body(i, x):
            return jnp.tanh(x @ x) * 0.5

        return jax.jit(lambda x: jax.lax.fori_loop(0, n, body, x))

    x = jnp.asarray(np.random.RandomState(0).randn(64, 64), jnp.float32)
    one, five = profile_call(loop(1), x).op_events, profile_call(loop(5), x).op_events
    assert five > one > 0
    assert (five - one) % 4 == 0


def test_gpu_kernel_names_join_their_hlo_ops():
    """XLA:GPU's kernel for HLO op `input_reduce_fusion.118` is named
    `input_reduce_fusion_118` in the trace: it joins that op (and its source line)."""
    from jaxrl_llm.bench.op_profile import summarise

    hlo = (
        "%fused_reduce.118 (p: f32[4,8], q: f32[8]) -> f32[4] {\n"
        "  ROOT %dot.1 = f32[4]{0} dot(%p, %q)\n}\n"
        "ENTRY %main {\n"
        "  ROOT %input_reduce_fusion.118 = f32[4]{0} fusion(%a, %b), calls=%fused_reduce.118\n"
        "  %copy.3 = f32[4]{0} copy(%input_reduce_fusion.118)\n}\n"
    )
    ev = lambda name, ts: {"name": name, "ph": "X", "ts": ts, "dur": 10, "pid": 7, "tid": 1}
    events = [ev("input_reduce_fusion_118", 0), ev("copy_3", 20), ev("memcpy", 40)]
    prof = summarise(hlo, events)
    assert prof.op_events == 2 and prof.total_ms == pytest.approx(0.02)
    assert prof.by_kind == pytest.approx({"matmul": 0.01, "copy": 0.01})

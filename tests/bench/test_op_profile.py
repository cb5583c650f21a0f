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

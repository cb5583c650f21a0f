"""Sequence packing: the layout places every token once; packed forwards, experience passes
and update steps equal the one-sample-per-row ones for every estimator and loss mode."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_llm.data.packing import first_fit_rows
from jaxrl_llm.learner.experience import make_experience_fn
from jaxrl_llm.learner.packing import (
    pack,
    packing_layout,
    padding_fraction,
    row_bucket,
    unpack,
    worth_packing,
)
from jaxrl_llm.learner.rl_config import AlgoConfig
from jaxrl_llm.learner.state import TrainState
from jaxrl_llm.learner.steps import make_critic_step, make_policy_step, to_micro_batches
from jaxrl_llm.models import ValueModel, init_model
from jaxrl_llm.testing import as_float64, assert_as_accurate, float64_twin, jitted, tiny_config
from jaxrl_llm.types import TrainBatch

from .rl_helpers import random_rows

CFG = tiny_config()
B, T, MB, G, TEMP = 8, 16, 4, 2, 0.7


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 24), min_size=1, max_size=12).flatmap(
        lambda ls: st.tuples(st.just(ls), st.sampled_from([1, 2, 3]))
    )
)
def test_layout_places_every_token_once(case):
    lengths, mb = case
    lengths = lengths[: len(lengths) // mb * mb] or [5] * mb
    seq_len = max(24, max(lengths))
    p = packing_layout(lengths, mb, seq_len, multiple=2)
    M, rows, _ = p.src.shape
    step = row_bucket(mb, 2)
    cap = -(-mb // 2) * 2  # mb rounded up to the row split
    assert rows <= cap
    assert rows % step == 0 or rows == cap
    for m in range(M):
        lens = lengths[m * mb : (m + 1) * mb]
        real = p.segment_ids[m] > 0
        assert real.sum() == sum(lens)
        # src and dst are inverse maps on the real tokens
        flat_dst = p.dst[m].reshape(-1)
        valid = flat_dst >= 0
        assert valid.sum() == sum(lens)
        np.testing.assert_array_equal(p.src[m].reshape(-1)[flat_dst[valid]], np.flatnonzero(valid))
        for j, n in enumerate(lens):
            np.testing.assert_array_equal(p.positions[m].reshape(-1)[p.dst[m, j, :n]], np.arange(n))
            assert np.all(p.segment_ids[m].reshape(-1)[p.dst[m, j, :n]] == j + 1)
            assert len(set(p.dst[m, j, :n] // seq_len)) == 1  # a sample stays in one row


def test_first_fit_fills_rows_and_rejects_bad_lengths():
    assert sorted(map(sorted, first_fit_rows([6, 4, 3, 3, 2], 8))) == [[0, 4], [1, 2], [3]]
    with pytest.raises(ValueError, match=r"holds 1\.\.8"):
        first_fit_rows([9], 8)
    with pytest.raises(ValueError, match=r"holds 1\.\.8"):
        first_fit_rows([0], 8)


def test_packing_is_used_only_when_it_removes_a_quarter_of_the_rows():
    assert worth_packing(packing_layout([4] * 4, 4, 8), 4)  # 2 rows of 4
    assert not worth_packing(packing_layout([6] * 4, 4, 8), 4)  # nothing shares a row


def test_padding_fraction_counts_packed_positions():
    lengths = [4, 4, 4, 4]
    p = packing_layout(lengths, 4, 8, multiple=1)
    assert p.src.shape == (1, 2, 8)
    assert padding_fraction(lengths, p, 8) == 0.0
    assert padding_fraction(lengths, None, 8) == 0.5


def _rows(seed=0):
    """Random samples (prompt 2-5, response >= 2, then padding) and their lengths."""
    rng = np.random.default_rng(seed)
    ids, mask = random_rows(rng, B, T, CFG.vocab_size)
    lengths = np.asarray([np.flatnonzero(m)[-1] + 1 for m in mask])
    return rng, jnp.asarray(ids), jnp.asarray(mask), lengths


def _packing(lengths, mb):
    return jax.tree.map(jnp.asarray, packing_layout(lengths, mb, T, multiple=1))


@pytest.mark.slow  # 7 s alone, AMD EPYC AVX2, jitted (2026-12-05)
def test_packed_forward_equals_per_sample_forward():
    model = init_model(CFG, seed=1)
    _, ids, _, lengths = _rows()
    p = jax.tree.map(lambda x: x[0], _packing(lengths, B))
    assert p.src.shape[0] < B  # several samples share a row
    forward = jitted()
    plain = forward(model, ids)
    packed = forward(model, pack(ids, p), p.positions, segment_ids=p.segment_ids)
    got = jax.vmap(lambda x: unpack(x, p), in_axes=-1, out_axes=-1)(packed)
    inside = np.arange(T)[None, :] < lengths[:, None]
    with jax.enable_x64(True):  # trusted: one sample a row; exact: the same in float64
        exact = np.asarray(forward(float64_twin(model), ids))
    assert_as_accurate(np.asarray(got)[inside], np.asarray(plain)[inside], exact[inside])


def _maybe(f, model):
    return None if model is None else f(model)


def _assert_as_accurate(got, trusted, exact):
    """(arrays, metrics) as accurate as the trusted path's against its float64 run
    (`testing.assert_as_accurate`)."""
    worst = assert_as_accurate(got, trusted, exact)
    print(f"error / bound: {worst:.2f}")


@pytest.mark.slow  # 17 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "gae"])
def test_packed_experience_equals_unpacked(models, estimator):
    """Packed experience is as accurate as unpacked against the unpacked pass in float64
    (GAE's returns A + V cancel to ~1e-3 from |V| ~ 10: no fixed tolerance fits every CPU)."""
    policy, ref, critic = models
    critic = critic if estimator == "gae" else None
    rng, ids, mask, lengths = _rows(1)
    algo = AlgoConfig(estimator=estimator, kl_in_reward_coef=0.05)
    scores = jnp.asarray(rng.integers(0, 2, B).astype(np.float32))
    rollout = jnp.asarray(rng.normal(size=(B, T)).astype(np.float32)) * mask

    def run(policy, ref, critic, packing=None):
        fn = make_experience_fn(
            nnx.graphdef(policy), _maybe(nnx.graphdef, critic), algo, temperature=TEMP,
            group_size=G, micro_batch=MB,
        )  # fmt: skip
        states = [_maybe(nnx.state, m) for m in (policy, ref, critic)]
        up = as_float64 if policy.config.dtype == "float64" else lambda x: x
        batch, rewards, metrics = fn(
            *states, ids, up(mask), up(mask), up(scores), up(rollout), packing
        )
        fields = ("old_logprobs", "ref_logprobs", "advantages", "returns", "old_values")
        arrays = {n: np.asarray(getattr(batch, n)) * np.asarray(mask) for n in fields}
        return jax.device_get(({**arrays, "token_rewards": rewards}, metrics))

    want = run(policy, ref, critic)
    got = run(policy, ref, critic, _packing(lengths, MB))
    with jax.enable_x64(True):  # trusted: unpacked; exact: unpacked in float64
        exact = run(*(_maybe(float64_twin, m) for m in (policy, ref, critic)))
    _assert_as_accurate(got, want, exact)


def _batch(rng, ids, mask) -> TrainBatch:
    f = lambda: jnp.asarray(rng.normal(size=(B, T)).astype(np.float32) * 0.1)
    return TrainBatch(
        input_ids=ids, loss_mask=mask, old_logprobs=f() - 4.0, ref_logprobs=f() - 4.0,
        advantages=f() * 10, returns=f(), old_values=f(), rollout_logprobs=f() - 4.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    "loss_agg",
    ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"],
)
@pytest.mark.slow  # 63 s in a loaded 2-worker run, AMD EPYC AVX2
def test_packed_policy_and_critic_steps_equal_unpacked(models, loss_agg):
    policy, _, critic = models
    rng, ids, mask, lengths = _rows(2)
    batch = to_micro_batches(_batch(rng, ids, mask), jnp.arange(B), MB)
    packing = _packing(lengths, MB)
    algo = AlgoConfig(loss_agg=loss_agg, use_kl_loss=True, entropy_coef=0.01, is_cap=2.0)
    tx = optax.sgd(0.1)

    def run(model, batch, packing=None):
        make = make_critic_step if isinstance(model, ValueModel) else make_policy_step
        extra = (TEMP,) if make is make_policy_step else ()
        graphdef, params = nnx.split(model)
        step = make(graphdef, tx, algo, *extra, response_budget=T)  # packed or not alike
        state = TrainState.create(jax.tree.map(jnp.copy, params), tx, jax.random.PRNGKey(0))
        state, metrics = step(state, batch, packing)
        return jax.device_get((state.params, metrics))

    for model in (policy, critic):
        want, got = run(model, batch), run(model, batch, packing)
        with jax.enable_x64(True):  # trusted: unpacked; exact: unpacked in float64
            exact = run(float64_twin(model), as_float64(batch))
        _assert_as_accurate(got, want, exact)


def test_pack_sequences_gives_one_sample_per_row_as_a_record():
    """Prompt then response, right-padded; the tool's tokens in `tool_mask`, not
    `response_mask`, with no rollout logprob; a sample cut at its budget is `truncated`."""
    from jaxrl_llm.learner.experience import SequenceRows, pack_sequences
    from jaxrl_llm.types import Completion

    def sample(prompt, tokens, mask, reason):
        logprobs = -np.arange(1, len(tokens) + 1, dtype=np.float32) * np.asarray(mask)
        return Completion(
            prompt_index=0, sample_index=0, prompt_ids=np.asarray(prompt),
            token_ids=np.asarray(tokens, np.int32), logprobs=logprobs, raw_logprobs=None,
            response_mask=np.asarray(mask, np.int32), finish_reason=reason, text="",
        )  # fmt: skip

    rows = pack_sequences(
        [sample([5, 6], [7, 8, 9], [1, 0, 1], "eos"), sample([5], [4, 3], [1, 1], "length")],
        seq_len=6,
        pad_id=0,
    )
    assert isinstance(rows, SequenceRows)
    for name, shape, dtype in [
        ("input_ids", (2, 6), np.int32),
        ("response_mask", (2, 6), np.float32),
        ("tool_mask", (2, 6), np.float32),
        ("rollout_logprobs", (2, 6), np.float32),
        ("response_length", (2,), np.int32),
        ("length", (2,), np.int32),
        ("truncated", (2,), np.bool_),
    ]:
        x = getattr(rows, name)
        assert (x.shape, x.dtype) == (shape, np.dtype(dtype)), name
    np.testing.assert_array_equal(rows.input_ids, [[5, 6, 7, 8, 9, 0], [5, 4, 3, 0, 0, 0]])
    np.testing.assert_array_equal(rows.response_mask, [[0, 0, 1, 0, 1, 0], [0, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(rows.tool_mask, [[0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(rows.rollout_logprobs[0], [0, 0, -1, 0, -3, 0])
    np.testing.assert_array_equal(rows.response_length, [3, 2])
    np.testing.assert_array_equal(rows.length, [5, 3])
    np.testing.assert_array_equal(rows.truncated, [False, True])
    with pytest.raises(ValueError, match="exceeds 4"):
        pack_sequences([sample([5, 6], [7, 8, 9], [1, 1, 1], "eos")], seq_len=4, pad_id=0)

"""Partial rollouts in the driver: newer weights handed over mid-generation (`refresh`) are
used from the next device call on, by the samples still decoding (on their KV) and by every
sample admitted after (from a prompt KV the new weights computed, also when its prompt was
prefilled before the swap); each token is tagged with the version that sampled it."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.rollout import RolloutDriver, SamplingParams
from jaxrl_llm.testing import assert_as_accurate
from tests.rollout.reference import exact_logprobs

RNG = np.random.RandomState(1)
PROMPTS = [list(RNG.randint(6, 128, n)) for n in (4, 9, 6, 2, 12, 7)]
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
# n = 3 on 4 slots, two prompts per prefill: a prompt's later samples wait, prefilled, for a
# slot, and a swap falls between its samples' inserts (its prompt must be prefilled again).
GROUPS = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3, n=3)


def _driver(engine, prefill_batch=1):
    return RolloutDriver(engine, steps_per_call=2, prefill_batch=prefill_batch)


def _swap_at(params, version: int, at: int):
    """A `refresh` that hands over (params, version) on its `at`-th call, else None."""
    calls = iter(range(1, 10**6))
    return lambda: (params, version) if next(calls) == at else None


def _perturbed(model):
    """The model's weights moved by 5%: what an update does, in miniature."""
    graphdef, state = nnx.split(model)
    leaves = jax.tree.map(lambda x: x * 1.05 if x.dtype.kind == "f" else x, state)
    return nnx.merge(graphdef, leaves)


def _split(c, version):
    """(the tokens tagged `version`, their logprobs) of a completion; tags are a prefix of
    one version then the other."""
    assert c.token_versions is not None and len(c.token_versions) == len(c.token_ids)
    assert np.all(np.diff(c.token_versions) >= 0)
    keep = c.token_versions == version
    return c.token_ids[keep], c.logprobs[keep]


@pytest.mark.slow  # 5 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
def test_a_relabelled_swap_changes_nothing_but_the_tags(tiny_engine):
    """The same weights handed over as version 2: the samples equal a run without a swap
    token for token and bit for bit, and the tags split every sample at one device call."""
    plain = _driver(tiny_engine).generate(PROMPTS, SAMPLING)
    assert all(c.token_versions is None for c in plain)  # untracked without `refresh`
    driver = _driver(tiny_engine)
    params = tiny_engine.load_params()
    swapped = driver.generate(PROMPTS, SAMPLING, refresh=_swap_at(params, 2, at=3), version=1)
    assert driver.stats["weight_swaps"] == 1
    for a, b in zip(plain, swapped, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
    tags = [set(c.token_versions.tolist()) for c in swapped]  # pyright: ignore[reportOptionalMemberAccess]
    assert {1, 2} in tags  # some samples were mid-decode at the swap
    assert tags[-1] == {2}  # the last prompt was admitted after it


@pytest.mark.slow  # 8 s in a loaded 2-worker fast-tier run, AMD EPYC AVX2 (2026-12-04)
@pytest.mark.parametrize(
    ("at", "sampling", "prefill_batch"),
    [(2, SAMPLING, 1), (4, SAMPLING, 1), (2, GROUPS, 8), (5, GROUPS, 8)],
    ids=["n1-at2", "n1-at4", "groups-at2", "groups-at5"],
)
def test_new_weights_take_over_running_samples_and_later_ones(
    tiny_model, tiny_engine, at, sampling, prefill_batch
):
    """Different weights at the `at`-th host check: a sample's tokens before the swap are
    those of a run with the old weights only, a sample admitted after it is that of a run
    with the new weights only (tokens equal, logprobs as accurate as that run's against the
    new model's float64 values: its prompt KV is the new weights' too), and the tokens after
    a mid-sample swap are not the old weights' (the new ones are in use)."""
    new_model = _perturbed(tiny_model)
    new = tiny_engine.place_params(nnx.state(new_model))
    old_params = tiny_engine.load_params()
    old_run = _driver(tiny_engine, prefill_batch).generate(PROMPTS, sampling, params=old_params)
    new_run = _driver(tiny_engine, prefill_batch).generate(PROMPTS, sampling, params=new)
    driver = _driver(tiny_engine, prefill_batch)
    mixed = driver.generate(PROMPTS, sampling, refresh=_swap_at(new, 8, at=at), version=7)
    assert driver.stats["weight_swaps"] == 1
    later, moved = [], 0
    for old, fresh, got in zip(old_run, new_run, mixed, strict=True):
        before, _ = _split(got, 7)
        np.testing.assert_array_equal(before, old.token_ids[: len(before)])
        if len(before) == 0:  # admitted after the swap: the new weights' sample
            np.testing.assert_array_equal(got.token_ids, fresh.token_ids)
            later.append((got, fresh))
        elif len(before) < len(got.token_ids):  # swapped mid-sample
            after = slice(len(before), len(got.token_ids))
            moved += not (
                np.array_equal(got.token_ids[after], old.token_ids[after])
                and np.array_equal(got.logprobs[after], old.logprobs[after])
            )
    assert later and moved  # both kinds happened, and the new weights were used
    got = np.concatenate([g.logprobs for g, _ in later])
    trusted = np.concatenate([f.logprobs for _, f in later])
    assert_as_accurate(got, trusted, exact_logprobs(new_model, [g for g, _ in later]))

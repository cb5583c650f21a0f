"""Stage records: a `Rollout` checks its shapes, selects and concatenates whole groups; a
`TrainBatch` is built by keyword from arrays of its dtypes."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_llm.types import Rollout, TrainBatch


@dataclasses.dataclass(frozen=True)
class _Sample:  # the fields of types.Completion that a Rollout reads
    prompt_ids: tuple
    token_ids: tuple


def _rollout(prompts, G=2, version=3):
    B = len(prompts) * G
    return Rollout(
        completions=tuple(_Sample((p,), tuple(range(j + 1))) for p in prompts for j in range(G)),
        answers=tuple(f"a{p}" for p in prompts for _ in range(G)),
        prompt_ids=tuple(prompts),
        scores=np.arange(B, dtype=np.float32),
        group_size=G,
        policy_version=version,
    )


def test_select_and_concat_keep_whole_groups_in_order():
    r = _rollout([10, 11, 12])
    kept = r.select_groups(np.array([True, False, True]))
    assert kept.prompt_ids == (10, 12) and kept.answers == ("a10", "a10", "a12", "a12")
    np.testing.assert_array_equal(kept.scores, [0, 1, 4, 5])
    both = Rollout.concat([kept, _rollout([20])], prompts=2)
    assert both.prompt_ids == (10, 12) and len(both.completions) == 4
    assert both.policy_version == 3 and both.group_size == 2
    assert r.num_tokens == 3 * (1 + 1) + 3 * (1 + 2)  # prompt token + 1 or 2 response tokens


def test_mismatched_shapes_are_refused():
    r = _rollout([10, 11])
    with pytest.raises(ValueError, match="4 samples, 2 prompts x G=3"):
        dataclasses.replace(r, group_size=3)
    with pytest.raises(ValueError, match="scores"):
        dataclasses.replace(r, scores=np.zeros(3, np.float32))


def _train_batch(shape=(2, 3), **changes):
    fields = {f.name: np.zeros(shape, np.float32) for f in dataclasses.fields(TrainBatch)}
    return TrainBatch(**{**fields, "input_ids": np.zeros(shape, np.int32), **changes})


def test_train_batch_is_built_by_keyword_from_arrays_of_its_dtypes_and_one_shape():
    arrays = [np.zeros((2, 3), np.int32)] + [np.zeros((2, 3), np.float32)] * 7
    with pytest.raises(TypeError):
        TrainBatch(*arrays)  # pyright: ignore[reportCallIssue]
    with pytest.raises(ValueError, match=r"input_ids is float32\[2, 3\]; expected int32"):
        _train_batch(input_ids=np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"TrainBatch\.loss_mask is int32"):
        _train_batch(loss_mask=np.zeros((2, 3), np.int32))  # ids and mask swapped, say
    with pytest.raises(ValueError, match=r"TrainBatch.advantages is float32\[2, 4\]"):
        _train_batch(advantages=np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"TrainBatch.input_ids is int32\[6\]"):
        _train_batch(shape=(6,))
    _train_batch(shape=(1, 2, 3))  # micro-batches [M, mb, T]
    jax.jit(lambda b: b)(_train_batch())  # rebuilt from tracers and abstract values inside
    spec = jax.ShapeDtypeStruct((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"TrainBatch\.input_ids is float32"):
        TrainBatch(**{f.name: spec for f in dataclasses.fields(TrainBatch)})


def test_a_reference_train_batch_is_float64_throughout_never_mixed():
    """A float64 reference run (docs/testing.md, Tolerances) builds its batch in float64
    under JAX's 64-bit mode: every float field, or none. Without that mode a float64 batch
    (numpy's default dtype) is refused: JAX would silently compute in float32."""
    wide = {f.name: np.zeros((2, 3), np.float64) for f in dataclasses.fields(TrainBatch)}
    floats = {k: v for k, v in wide.items() if k != "input_ids"}
    with pytest.raises(ValueError, match=r"loss_mask is float64\[2, 3\]; expected float32"):
        _train_batch(**floats)
    with jax.enable_x64(True):
        _train_batch(**floats)
        with pytest.raises(ValueError, match=r"old_logprobs is float32\[2, 3\]; expected"):
            _train_batch(loss_mask=wide["loss_mask"])
    with pytest.raises(ValueError, match=r"advantages is float64\[2, 3\]; expected float32"):
        _train_batch(advantages=wide["advantages"])


def test_a_float64_model_needs_jax_64_bit_mode():
    from jaxrl_llm.models.config import as_dtype

    with pytest.raises(ValueError, match=r"float64 needs JAX's 64-bit mode"):
        as_dtype("float64")
    with jax.enable_x64(True):
        assert as_dtype("float64") == np.float64

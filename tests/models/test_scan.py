"""`ModelConfig.scan_layers`: the uncached forward as one `lax.scan` over the layers' stacked
states gives the unrolled forward's logits and gradients (with remat, padding and packed
segments, sharded over FSDP x TP) and transformers' logits on the same checkpoint."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.models import from_pretrained
from jaxrl_llm.sharding import build_mesh
from jaxrl_llm.testing import assert_as_accurate, float64_twin


def _inputs(vocab, B=3, T=20, seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, vocab, (B, T))
    mask = np.ones((B, T), np.int32)
    mask[1, :6] = 0  # left padding
    segments = np.ones((B, T), np.int32)
    segments[2, 9:] = 2  # row 2 packs two sequences
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    positions[2, 9:] = np.arange(T - 9)
    return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments), jnp.asarray(positions)


def _logits_and_grads(model, ids, mask, segments, positions):
    graphdef, state = nnx.split(model)

    def loss(s):
        logits = nnx.merge(graphdef, s)(ids, positions, mask, segments)
        return jnp.sum(jax.nn.log_softmax(logits)[..., 3] * mask), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    return np.asarray(logits), [np.asarray(g) for g in jax.tree.leaves(grads)]


@functools.cache
def _exact_logits_and_grads(path, B=3, seed=0):
    """`_logits_and_grads` of the checkpoint's float64 twin (unrolled, unsharded) on
    `_inputs(V, B, seed)`: the exact values the float32 forwards are measured against
    (`testing.assert_as_accurate`), once for both `remat` settings (same function)."""
    model = from_pretrained(path)
    with jax.enable_x64(True):
        return _logits_and_grads(
            float64_twin(model), *_inputs(model.config.vocab_size, B=B, seed=seed)
        )


@pytest.mark.slow  # measured: 9 s and 12 s on 2 shared cores (docs/testing.md)
@pytest.mark.parametrize("remat", [False, True])
def test_scanned_equals_unrolled_logits_and_grads(qwen_checkpoint, remat):
    path, _ = qwen_checkpoint
    unrolled = from_pretrained(path, remat=remat)
    scanned = from_pretrained(path, remat=remat, scan_layers=True)
    assert scanned.config.num_layers > 1
    inputs = _inputs(unrolled.config.vocab_size)
    want_logits, want_grads = _logits_and_grads(unrolled, *inputs)
    got_logits, got_grads = _logits_and_grads(scanned, *inputs)
    assert len(got_grads) == len(want_grads)
    exact = _exact_logits_and_grads(path)
    # trusted: the unrolled forward; exact: the same in float64
    worst = assert_as_accurate((got_logits, got_grads), (want_logits, want_grads), exact)
    print(f"scanned error / bound = {worst:.2f}")


def test_scanned_logits_equal_transformers(qwen_checkpoint):
    path, torch_model = qwen_checkpoint
    model = from_pretrained(path, scan_layers=True)
    ids, mask, _, positions = _inputs(model.config.vocab_size, seed=1)
    with torch.no_grad():
        ref = torch_model(
            input_ids=torch.tensor(np.asarray(ids)),
            attention_mask=torch.tensor(np.asarray(mask)),
            position_ids=torch.tensor(np.asarray(positions)),
        ).logits.numpy()
    ours = np.asarray(model(ids, positions, mask))
    real = np.asarray(mask).astype(bool)
    assert np.abs(ours - ref)[real].max() <= 1e-4


@pytest.mark.slow  # measured: 12 s on 2 shared cores (docs/testing.md)
def test_scanned_equals_unrolled_sharded(qwen_checkpoint):
    path, _ = qwen_checkpoint
    mesh = build_mesh(data=1, fsdp=2, tensor=4)
    unrolled = from_pretrained(path, mesh=mesh)
    scanned = from_pretrained(path, scan_layers=True, mesh=mesh)
    inputs = _inputs(unrolled.config.vocab_size, B=4, seed=2)
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    inputs = [jax.device_put(x, rows) for x in inputs]
    want_logits, want_grads = _logits_and_grads(unrolled, *inputs)
    got_logits, got_grads = _logits_and_grads(scanned, *inputs)
    exact = _exact_logits_and_grads(path, B=4, seed=2)
    # trusted: the unrolled forward on the same mesh; exact: it in float64, unsharded
    worst = assert_as_accurate((got_logits, got_grads), (want_logits, want_grads), exact)
    print(f"scanned error / bound = {worst:.2f}")

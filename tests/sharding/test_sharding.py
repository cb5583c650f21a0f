"""Sharded == unsharded on a simulated 2x4 (fsdp x tensor) mesh; golden parameter specs.

Sharded == unsharded: the sharded float32 result is as accurate as the unsharded one, both
measured against the unsharded model run in float64 (`testing.assert_as_accurate`, issue
#26), not within a fixed tolerance.
"""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.models import KVCache, ModelConfig, from_pretrained, init_model
from jaxrl_llm.sharding import (
    SAMPLE_RULES,
    TRAIN_RULES,
    ShardingContext,
    build_mesh,
    logical_to_spec,
    reshard,
    resolve_mesh_shape,
    state_specs,
    target_shardings,
)
from jaxrl_llm.testing import assert_as_accurate, float64_twin, write_reference_checkpoint

GOLDEN = Path(__file__).parent / "golden_param_specs.json"


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8, "tests/conftest.py must set 8 simulated devices"
    return build_mesh(data=1, fsdp=2, tensor=4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("shard_ckpt")
    write_reference_checkpoint(path, "qwen2", seed=7, num_attention_heads=8, head_dim=8)
    return path


@pytest.fixture(scope="module")
def twin(checkpoint):
    """The unsharded model in float64 (`float64_twin`): call it under `jax.enable_x64`."""
    with jax.enable_x64(True):
        return float64_twin(from_pretrained(checkpoint))


def test_resolve_mesh_shape():
    assert resolve_mesh_shape(1, -1, 4, num_devices=8) == (1, 2, 4)
    assert resolve_mesh_shape(-1, 1, 1, num_devices=8) == (8, 1, 1)
    with pytest.raises(ValueError, match="at most one"):
        resolve_mesh_shape(-1, -1, 1, num_devices=8)
    with pytest.raises(ValueError, match="cannot be split"):
        resolve_mesh_shape(1, -1, 3, num_devices=8)
    with pytest.raises(ValueError, match="needs 4 devices"):
        resolve_mesh_shape(1, 2, 2, num_devices=8)


def test_logical_to_spec_drops_axes_that_do_not_divide(mesh):
    assert logical_to_spec(("embed", "heads", None), TRAIN_RULES, mesh, (64, 8, 8)) == (
        PartitionSpec("fsdp", "tensor")
    )
    # 2 KV heads cannot split over tensor=4: replicated, not an error.
    assert logical_to_spec(("embed", "kv_heads", None), TRAIN_RULES, mesh, (64, 2, 8)) == (
        PartitionSpec("fsdp")
    )
    assert logical_to_spec(("batch", "seq"), TRAIN_RULES, mesh, (8, 5)) == PartitionSpec("fsdp")
    # Sampling keeps weights whole over fsdp.
    assert logical_to_spec(("embed", "mlp"), SAMPLE_RULES, mesh, (64, 96)) == PartitionSpec(
        None, "tensor"
    )
    with pytest.raises(KeyError, match="no rule"):
        logical_to_spec(("nonsense",), TRAIN_RULES, mesh)


def test_golden_param_specs(mesh):
    cfg = ModelConfig()
    abstract = nnx.eval_shape(lambda: init_model(cfg, seed=0))
    _, state = nnx.split(abstract)
    got = {
        "mesh": dict(mesh.shape),
        "train": state_specs(state, mesh, TRAIN_RULES),
        "sample": state_specs(state, mesh, SAMPLE_RULES),
    }
    qwen3 = ModelConfig(model_type="qwen3", qk_norm=True, qkv_bias=False)  # + q/k norm weights
    _, state3 = nnx.split(nnx.eval_shape(lambda: init_model(qwen3, seed=0)))
    got["qwen3_train"] = state_specs(state3, mesh, TRAIN_RULES)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    expected = json.loads(GOLDEN.read_text())
    assert got == expected, "parameter partition specs changed; rerun with UPDATE_GOLDEN=1"


@pytest.mark.slow  # 9 s in a loaded 2-worker run, AMD EPYC AVX2
def test_init_and_load_are_born_sharded(mesh, checkpoint):
    cfg = ModelConfig()
    model = init_model(cfg, seed=0, mesh=mesh)
    q = model.model.layers[0].self_attn.q_proj[...]
    assert q.sharding.spec == PartitionSpec("fsdp", "tensor")
    assert len(q.addressable_shards) == 8
    assert q.addressable_shards[0].data.shape == (32, 1, 16)
    loaded = from_pretrained(checkpoint, mesh=mesh)
    emb = loaded.model.embed_tokens[...]
    assert emb.sharding.spec == logical_to_spec(("vocab", "embed"), TRAIN_RULES, mesh, emb.shape)


def _forward(model, ids, mask):
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, i, m: nnx.merge(graphdef, s)(i, attention_mask=m))
    return np.asarray(fn(state, ids, mask))


@pytest.mark.slow  # 9 s in a loaded 2-worker run, AMD EPYC AVX2
def test_sharded_forward_equals_unsharded(mesh, checkpoint, twin):
    plain = from_pretrained(checkpoint)
    sharded = from_pretrained(checkpoint, mesh=mesh)
    rng = np.random.RandomState(0)
    ids = jnp.asarray(rng.randint(0, plain.config.vocab_size, (8, 16)))
    mask = np.ones((8, 16), np.int32)
    mask[3, :4] = 0
    mask = jnp.asarray(mask)
    ref = _forward(plain, ids, mask)
    batch_sharding = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    out = _forward(sharded, jax.device_put(ids, batch_sharding), mask)
    with jax.enable_x64(True):
        exact = _forward(twin, ids, mask)
    # got: sharded logits; trusted: unsharded float32 logits; exact: unsharded float64 logits.
    print("error / bound:", round(assert_as_accurate(out, ref, exact), 2))


@pytest.mark.slow  # 19 s in a loaded 2-worker run, AMD EPYC AVX2
def test_sharded_grad_equals_unsharded(mesh, checkpoint, twin):
    plain = from_pretrained(checkpoint)
    sharded = from_pretrained(checkpoint, mesh=mesh)
    ids = jnp.asarray(np.random.RandomState(1).randint(0, plain.config.vocab_size, (8, 12)))

    def grads(model):
        graphdef, state = nnx.split(model)

        @jax.jit
        def g(state):
            return jax.grad(lambda s: nnx.merge(graphdef, s)(ids).std())(state)

        return jax.tree.leaves(g(state))

    with jax.enable_x64(True):
        exact = grads(twin)
    # got: sharded grads; trusted: unsharded float32 grads; exact: unsharded float64 grads.
    pairs = zip(grads(plain), grads(sharded), exact, strict=True)
    print("error / bound:", round(max(assert_as_accurate(b, a, x) for a, b, x in pairs), 2))


@pytest.mark.slow  # 8 s in a loaded 2-worker run, AMD EPYC AVX2
def test_sharded_cache_decode_equals_unsharded(mesh, checkpoint, twin):
    plain = from_pretrained(checkpoint)
    sampling = from_pretrained(checkpoint, mesh=mesh, rules=SAMPLE_RULES)
    ids = jnp.asarray(np.random.RandomState(2).randint(0, plain.config.vocab_size, (8, 6)))
    ctx = ShardingContext(mesh, SAMPLE_RULES)

    def run(model, cache):
        graphdef, state = nnx.split(model)
        fn = jax.jit(lambda s, c: nnx.merge(graphdef, s).extend(c, ids, jnp.zeros(8, jnp.int32)))
        h, cache = fn(state, cache)
        return np.asarray(model.logits(h)), cache

    cache = KVCache.zeros(plain.config, 8, 10)
    ref, _ = run(plain, cache)
    sharded_cache = jax.device_put(cache, ctx.sharding(KVCache.logical_axes(), cache.k.shape))
    out, new_cache = run(sampling, sharded_cache)
    with jax.enable_x64(True):
        exact, _ = run(twin, KVCache.zeros(twin.config, 8, 10))
    # got: sharded cache logits; trusted: unsharded float32 ones; exact: unsharded float64 ones.
    print("error / bound:", round(assert_as_accurate(out, ref, exact), 2))
    assert new_cache.k.sharding.spec == ctx.spec(KVCache.logical_axes(), cache.k.shape)


def test_reshard_train_to_sample_is_pointer_when_layouts_match(mesh, checkpoint):
    model = from_pretrained(checkpoint, mesh=mesh)
    _, state = nnx.split(model)
    params = jax.tree.map(lambda v: v, state)
    train = target_shardings(state, mesh, TRAIN_RULES)
    same = reshard(params, train)
    assert all(a is b for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(params)))
    sample = target_shardings(state, mesh, SAMPLE_RULES)
    moved = reshard(params, sample)
    for x, s, orig in zip(jax.tree.leaves(moved), jax.tree.leaves(sample), jax.tree.leaves(params)):
        assert x.sharding.is_equivalent_to(s, x.ndim)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(orig))

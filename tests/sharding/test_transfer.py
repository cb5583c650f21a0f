"""`transfer.put_apart`: arrays onto devices apart from their own, against `jax.device_put`."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_llm.sharding import transfer


def _meshes():
    d = jax.devices()
    return Mesh(np.array(d[:4]), ("fsdp",)), Mesh(np.array(d[4:]).reshape(2, 2), ("data", "tensor"))


def _trainer_tree(train: Mesh):
    """Leaves as a trainer holds them: FSDP rows, a replicated bias, a bfloat16 matrix, a
    scalar, an odd shape that does not split."""
    rng = np.random.default_rng(0)
    fsdp, rep = NamedSharding(train, P("fsdp")), NamedSharding(train, P())
    tree = {
        "w": jax.device_put(rng.standard_normal((64, 48), np.float32), fsdp),
        "big": jax.device_put(rng.standard_normal((2048, 1024), np.float32), fsdp),  # 8 MB
        "b": jax.device_put(rng.standard_normal((48,), np.float32), rep),
        "bf": jax.device_put(rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16), fsdp),
        "step": jax.device_put(np.int32(7), rep),
        "odd": jax.device_put(np.arange(15, dtype=np.int32).reshape(3, 5), rep),
    }
    return jax.jit(lambda t: jax.tree.map(jnp.copy, t))(tree)  # fresh outputs, as a step's


@pytest.mark.parametrize("spec", [P(), P(None, "tensor")])
def test_put_apart_equals_device_put_and_shares_one_host_copy(spec):
    train, sampler = _meshes()
    tree = _trainer_tree(train)
    shard = lambda x: NamedSharding(sampler, spec if x.ndim == 2 and x.shape[1] % 2 == 0 else P())
    targets = jax.tree.map(shard, tree)
    moved = transfer.put_apart(tree, targets)
    for x, y, s in zip(jax.tree.leaves(tree), jax.tree.leaves(moved), jax.tree.leaves(targets)):
        assert y.sharding.is_equivalent_to(s, y.ndim) and y.dtype == x.dtype
        assert y.sharding.device_set == set(sampler.devices.flat)
        # Nothing kept on the trainer's array (jax.device_put caches a whole host copy there).
        assert x._npy_value is None
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
        pointers = {s.data.unsafe_buffer_pointer() for s in y.addressable_shards}
        if y.sharding.is_fully_replicated:  # the four devices read one buffer
            assert len(pointers) == 1
    reference = jax.device_put(tree, targets)  # the old path: a host copy per device
    for y, r in zip(jax.tree.leaves(moved), jax.tree.leaves(reference)):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(r))


def test_a_moved_copy_outlives_its_source_and_a_donating_update():
    train, sampler = _meshes()
    tree = _trainer_tree(train)
    before = {k: np.asarray(v) for k, v in tree.items()}
    moved = transfer.put_apart(tree, jax.tree.map(lambda _: NamedSharding(sampler, P()), tree))
    bump = jax.jit(lambda t: jax.tree.map(lambda a: a + 1, t), donate_argnums=0)
    tree = bump(tree)  # the trainer's buffers reused in place
    del tree
    for k, v in moved.items():
        np.testing.assert_array_equal(np.asarray(v), before[k])


def test_aligned_empty_is_aligned_for_any_size_and_dtype():
    for shape, dtype in [((), np.float32), ((3,), np.int8), ((1000, 7), ml_dtypes.bfloat16)]:
        a = transfer.aligned_empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.ctypes.data % transfer.ALIGN == 0

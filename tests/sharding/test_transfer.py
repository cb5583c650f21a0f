"""`transfer.put_apart`: arrays onto devices apart from their own, against `jax.device_put`."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_llm.sharding import hosts, transfer


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


@pytest.mark.parametrize("spec", [P(), P(None, "tensor")])
def test_the_device_path_equals_device_put_and_never_goes_through_the_host(spec, monkeypatch):
    """The accelerators' path, run on CPU devices: each destination device pulls its part
    from every source shard that holds some of it, device to device."""
    monkeypatch.setattr(transfer, "PENDING_BYTES", 1 << 20)  # waits inside the tree too
    puts, waits = [], []
    put, wait = jax.device_put, jax.block_until_ready

    def recording_put(x, device=None, **kw):
        if isinstance(device, jax.Device) and isinstance(x, jax.Array):
            puts.append((x.shape, next(iter(x.devices())), device))
        return put(x, device, **kw)

    monkeypatch.setattr(jax, "device_put", recording_put)
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waits.append(1) or wait(x))
    train, sampler = _meshes()
    tree = _trainer_tree(train)
    shard = lambda x: NamedSharding(sampler, spec if x.ndim == 2 and x.shape[1] % 2 == 0 else P())
    targets = jax.tree.map(shard, tree)
    moved = transfer.put_apart(tree, targets, path="devices")
    for x, y, s in zip(*map(jax.tree.leaves, (tree, moved, targets))):
        assert y.sharding.is_equivalent_to(s, y.ndim) and y.dtype == x.dtype
        assert y.sharding.device_set == set(sampler.devices.flat)
        assert x._npy_value is None  # never assembled on the host
    reference = put(tree, targets)  # the host path (it caches a host copy on `tree`)
    for x, y, r in zip(*map(jax.tree.leaves, (tree, moved, reference))):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
        np.testing.assert_array_equal(np.asarray(y), np.asarray(r))
    # The 8 MB array's rows are split over the four trainer devices: each destination pulls
    # one piece from each (cut to its columns where the target splits them).
    rows = [(shape, src, dst) for shape, src, dst in puts if shape[:1] == (512,)]
    cols = 1024 if spec == P() else 512
    assert {shape for shape, _, _ in rows} == {(512, cols)}
    assert sorted((src.id, dst.id) for _, src, dst in rows) == sorted(
        (s.id, d.id) for s in train.devices.flat for d in sampler.devices.flat
    )
    # A replicated source: each destination reads another replica.
    bias = [(src, dst) for shape, src, dst in puts if shape == (48,)]
    assert len({src for src, _ in bias}) == 4 and len(bias) == 4
    assert all(src in set(train.devices.flat) for _, src, _ in puts)
    assert waits  # the 8 MB array passed PENDING_BYTES


def test_an_unknown_path_is_refused_by_name():
    train, sampler = _meshes()
    tree = {"b": jax.device_put(np.ones(4, np.float32), NamedSharding(train, P()))}
    out = {"b": NamedSharding(sampler, P())}
    with pytest.raises(ValueError, match="'auto', 'host', 'devices'"):
        transfer.put_apart(tree, out, path="d2d")
    with pytest.raises(ValueError, match="'auto', 'host', 'devices'"):  # when it is built
        hosts.WeightSync(tree, train, out, transfer="d2d")

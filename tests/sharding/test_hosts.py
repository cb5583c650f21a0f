"""`sharding.hosts` in one process (8 simulated devices); the two-process behaviour is tested
end to end in tests/integration/test_multihost.py."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.models import init_model
from jaxrl_llm.sharding import SAMPLE_RULES, TRAIN_RULES, build_mesh, hosts, target_shardings
from jaxrl_llm.testing import tiny_config

CFG = tiny_config()


def test_one_process_keeps_the_training_mesh_and_gathers_nothing():
    mesh = build_mesh(2, 2, 2)
    assert hosts.local_sampling_mesh(mesh) is mesh
    assert hosts.allgather_objects({"a": [1, 2]}) == [{"a": [1, 2]}]


def test_host_replicated_mesh_is_the_hosts_sampling_meshes_stacked():
    mesh = build_mesh(1, 4, 2)
    stacked = hosts.host_replicated_mesh(mesh)
    assert dict(stacked.shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    # Tensor groups of the training mesh stay together.
    groups = {tuple(d.id for d in g) for g in mesh.devices.reshape(-1, 2)}
    assert {tuple(d.id for d in g) for g in stacked.devices.reshape(-1, 2)} == groups


def test_batch_sharding_splits_rows_only_when_they_divide():
    mesh = build_mesh(2, 2, 2)
    assert hosts.batch_sharding(mesh, (8, 3)).spec == PartitionSpec(("data", "fsdp"), None)
    assert hosts.batch_sharding(mesh, (6, 3)).spec == PartitionSpec(None, None)
    assert hosts.batch_sharding(mesh, (2, 8, 3), axis=1).spec == PartitionSpec(
        None, ("data", "fsdp"), None
    )


def test_global_array_and_to_host_round_trip():
    mesh = build_mesh(2, 4, 1)
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    arr = hosts.global_array(x, hosts.batch_sharding(mesh, x.shape))
    assert len(arr.addressable_shards) == 8 and arr.addressable_shards[0].data.shape == (1, 3)
    np.testing.assert_array_equal(hosts.to_host(arr), x)
    np.testing.assert_array_equal(hosts.to_host(x), x)


@pytest.mark.slow  # 10 s in a loaded 2-worker run, AMD EPYC AVX2
@pytest.mark.parametrize("cast", [None, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(2, 1, 4), (1, 4, 2)])
def test_weight_sync_hands_over_in_the_sampling_layout(shape, cast):
    """One process: the trainer's own arrays when the layouts agree (fsdp=1, no cast); else
    one jitted cast/reshard into the engine's layout (weights replicated over fsdp)."""
    mesh = build_mesh(*shape)
    params = nnx.state(init_model(CFG, seed=0, mesh=mesh, rules=TRAIN_RULES))
    fn = None if cast is None else jax.jit(lambda p: jax.tree.map(lambda x: x.astype(cast), p))
    local = target_shardings(params, mesh, SAMPLE_RULES)
    out = hosts.WeightSync(params, mesh, local, cast=fn)(params)
    if cast is None and shape[1] == 1:
        assert out is params  # no copy
    for x, y, s in zip(jax.tree.leaves(out), jax.tree.leaves(params), jax.tree.leaves(local)):
        assert x.sharding.is_equivalent_to(s, x.ndim)
        assert x.dtype == (cast or y.dtype)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y).astype(x.dtype))


class _Device:
    """A device of a faked multi-host mesh: `_host_grid` reads only `process_index`."""

    def __init__(self, process_index: int):
        self.process_index = process_index


def _mesh_over(processes: list[int], shape: tuple[int, int, int]):
    devices = np.empty(len(processes), dtype=object)
    devices[:] = [_Device(p) for p in processes]
    return SimpleNamespace(
        shape=dict(zip(("data", "fsdp", "tensor"), shape)), devices=devices.reshape(shape)
    )


@pytest.mark.parametrize("processes, shape, message", [
    ([0, 0, 1, 1], (1, 1, 4), "MeshConfig.tensor = 4 does not fit in a host's 2 devices"),
    ([0, 0, 1, 1, 2, 2], (1, 2, 3), "MeshConfig.tensor = 3 does not fit in a host's 2 devices"),
    ([0, 1, 0, 1], (2, 1, 2), "a tensor group of the training mesh spans hosts"),
])  # fmt: skip
def test_a_tensor_axis_that_spans_hosts_is_a_config_error(processes, shape, message):
    with pytest.raises(ConfigError, match=message) as e:
        hosts._host_grid(_mesh_over(processes, shape), 0)  # type: ignore[arg-type]
    assert "\n" not in str(e.value) and "keep the tensor axis within a host" in str(e.value)

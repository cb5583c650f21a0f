"""`train` refuses a multi-host mesh whose tensor axis does not fit in one host's devices
(each host samples on its own devices: `sharding.hosts.local_sampling_mesh`) with one line,
before anything loads. Several processes are faked by their counts (a real two-process run:
tests/integration/test_multihost.py)."""

import jax
import pytest

from jaxrl_llm import cli
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner import commands, rl_loop
from jaxrl_llm.learner.rl_config import MeshConfig
from jaxrl_llm.sharding import hosts


def _fake_hosts(monkeypatch, processes: int, per_host: int) -> None:
    monkeypatch.setattr(jax, "process_count", lambda: processes)
    monkeypatch.setattr(jax, "device_count", lambda *a, **k: processes * per_host)
    monkeypatch.setattr(jax, "local_device_count", lambda *a, **k: per_host)


SPANNING = [
    (2, 2, MeshConfig(fsdp=1, tensor=4)),  # the reviewer's two processes x 2 devices
    (3, 2, MeshConfig(fsdp=-1, tensor=3)),
    (2, 4, MeshConfig(fsdp=1, tensor=-1)),  # -1 resolves to 8
    (2, 4, MeshConfig(fsdp=-1, tensor=8)),
]


@pytest.mark.parametrize("processes, per_host, mesh", SPANNING)
def test_a_tensor_axis_across_hosts_is_one_config_error(monkeypatch, processes, per_host, mesh):
    _fake_hosts(monkeypatch, processes, per_host)
    with pytest.raises(ConfigError) as e:
        commands.check_mesh(mesh)
    message = str(e.value)
    assert "\n" not in message
    assert f"does not fit in a host's {per_host} devices" in message
    assert "keep the tensor axis within a host" in message and "fsdp/data" in message


@pytest.mark.parametrize("processes, per_host, mesh", [
    (2, 4, MeshConfig(fsdp=-1, tensor=2)),
    (2, 4, MeshConfig(fsdp=-1, tensor=4)),
    (3, 2, MeshConfig(data=3, fsdp=1, tensor=2)),
    (1, 8, MeshConfig(fsdp=1, tensor=8)),  # one process: the whole mesh is the host's
])  # fmt: skip
def test_a_tensor_axis_within_a_host_passes(monkeypatch, processes, per_host, mesh):
    _fake_hosts(monkeypatch, processes, per_host)
    commands.check_mesh(mesh)


def test_train_stops_before_it_loads_or_writes_anything(tmp_path, monkeypatch, capsys):
    for name in ("JAXRL_COORDINATOR_ADDRESS", "JAXRL_DISTRIBUTED"):
        monkeypatch.delenv(name, raising=False)
    _fake_hosts(monkeypatch, 2, 2)
    monkeypatch.setattr(hosts, "allgather_objects", lambda obj, tag=None: [obj, obj])

    def run_rl(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr(rl_loop, "run_rl", run_rl)
    run = tmp_path / "run"
    argv = ["train", f"--run_dir={run}", "--gin_param=MeshConfig.tensor=4",
            "--gin_param=MeshConfig.fsdp=1"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-llm train: configuration error: MeshConfig.tensor = 4"), err
    assert len(err.strip().splitlines()) == 1 and not run.exists()

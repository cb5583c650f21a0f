"""`plan` refuses what `train` refuses (`RLConfig.validate`), checks its own flags, and
suggests only a micro-batch size `train` takes and meshes `train` can build."""

import json
import re

import pytest

from jaxrl_llm import cli
from jaxrl_llm.learner.plan import Workload, plan_memory
from jaxrl_llm.learner.plan_cli import suggest
from jaxrl_llm.learner.plan_shapes import model_config

REFUSED = [
    (["--gin_param=AlgoConfig.mini_batches=3"], "AlgoConfig.mini_batches = 3 does not divide"),
    (["--gin_param=RolloutConfig.temperature=0.0"], "RolloutConfig.temperature = 0.0 (greedy)"),
    (["--gin_param=AlgoConfig.micro_batch_size=5"], "AlgoConfig.micro_batch_size = 5 does not"),
    (["--device-memory-gb=0"], "--device-memory-gb = 0.0: expected a size > 0"),
    (["--device-memory-gb=-5"], "--device-memory-gb = -5.0: expected a size > 0"),
    (["--devices-per-host=0"], "--devices-per-host = 0: expected an integer >= 1"),
    (["--devices=0"], "--devices = 0: expected an integer >= 1"),  # the last --devices wins
    (["--gin_param=MeshConfig.tensor=0"], "MeshConfig data=1, fsdp=-1, tensor=0: mesh sizes"),
    (["--gin_param=MeshConfig.data=3"], "MeshConfig data=3, fsdp=-1, tensor=1: 4 devices cannot"),
]


@pytest.mark.parametrize("flags, message", REFUSED, ids=[m for _, m in REFUSED])
def test_plan_refuses_what_train_refuses(flags, message, capsys):
    argv = ["plan", "--devices=4", "--device-memory-gb=16", "--json", *flags]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-llm plan: configuration error: ") and message in err, err


@pytest.mark.parametrize("micro_batch, micro_batches, rows, expected", [
    (15, 1, 1, 5),  # half of 15 is 7, which does not divide 15: the largest that does
    (16, 2, 1, 8),  # half
    (12, 1, 8, None),  # does not split over 8 devices and 8 does not divide 12: none
    (6, 4, 4, 4),  # 24 rows a mini-batch; 6 does not split over 4 devices: 4 does, divides 24
    (1, 16, 8, 8),  # smaller than the devices: as many rows as devices, a divisor of 16
])  # fmt: skip
def test_the_suggested_micro_batch_divides_the_mini_batch(
    micro_batch, micro_batches, rows, expected
):
    builtin = model_config("builtin")
    work = Workload(micro_batch=micro_batch, seq_len=256, micro_batches=micro_batches,
                    slots=8, cache_len=257)  # fmt: skip
    mesh = (1, rows, 1)
    plan = plan_memory(builtin, mesh, work, device_memory=1.0)  # fits nothing: suggest
    changes = [s["change"] for s in suggest(builtin, mesh, work, plan)]
    sizes = [int(c.split("=")[1]) for c in changes if c.startswith("AlgoConfig.micro_batch_size")]
    assert sizes == ([] if expected is None else [expected])


# (--devices, --devices-per-host, the mesh, the mesh changes expected): odd axes included
ODD_MESHES = [
    (6, None, {"data": 3, "fsdp": 2},
     {"MeshConfig.data=1 (fsdp=6)", "MeshConfig.tensor=2 (fsdp=1)"}),
    (6, None, {"fsdp": 3, "tensor": 2}, {"MeshConfig.tensor=6 (fsdp=1)"}),
    (12, 4, {"data": 3, "fsdp": 2, "tensor": 2},
     {"MeshConfig.data=1 (fsdp=6)", "MeshConfig.tensor=4 (fsdp=1)"}),
    (6, 2, {"fsdp": 3, "tensor": 2}, set()),  # tensor=6 would not fit in a host's 2 devices
]  # fmt: skip


@pytest.mark.parametrize("devices, per_host, mesh, expected", ODD_MESHES)
def test_the_suggested_meshes_are_ones_train_builds(devices, per_host, mesh, expected, capsys):
    """Each suggested mesh has the devices' product and fits a host; fed back to `plan`, it
    is planned (exit 1: still over the tiny memory), not refused (exit 2)."""
    flags = ["plan", f"--devices={devices}", "--device-memory-gb=0.001", "--json"]
    flags += [f"--devices-per-host={per_host}"] if per_host else []
    binds = lambda m: [f"--gin_param=MeshConfig.{k}={v}" for k, v in m.items()]
    assert cli.main(flags + binds(mesh)) == 1
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    changes = {s["change"] for s in out["suggestions"] if s["change"].startswith("MeshConfig.")}
    assert changes == expected
    for change in changes:
        axes = {k: int(v) for k, v in re.findall(r"(data|fsdp|tensor)=(\d+)", change)}
        assert cli.main(flags + binds({**mesh, **axes})) == 1, capsys.readouterr().err
        planned = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mesh"]
        assert planned == {"data": 1, "fsdp": 1, "tensor": 1, **mesh, **axes}

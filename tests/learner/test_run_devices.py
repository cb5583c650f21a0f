"""`MeshConfig.devices`: a run on the first N of this process's devices. The suite's 8
simulated CPU devices make a tiny model's run several times slower than one device does
(docs/testing.md), so the end-to-end tests that are not about sharding train on one."""

import jax
import numpy as np
import pytest

from jaxrl_llm import cli
from jaxrl_llm.config import parse_gin
from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner import commands
from jaxrl_llm.learner.rl_config import MeshConfig, RLConfig
from jaxrl_llm.learner.rl_loop import close_run, train
from jaxrl_llm.learner.run import build_run
from jaxrl_llm.sharding.mesh import run_devices
from jaxrl_llm.testing import register_test_rewards

from .rl_helpers import TINY_RL_PARAMS


def test_run_devices_are_the_first_ones():
    devices = jax.devices()
    assert run_devices() == run_devices(-1) == devices
    assert run_devices(1) == devices[:1] and run_devices(3) == devices[:3]
    for bad in (0, len(devices) + 1):
        with pytest.raises(ConfigError, match=f"MeshConfig.devices = {bad}: this process has"):
            run_devices(bad)


def test_the_mesh_check_counts_the_runs_devices():
    commands.check_mesh(MeshConfig(devices=2, fsdp=2))
    commands.check_mesh(MeshConfig(devices=3, rollout_devices=1))  # fsdp -1: the other 2
    with pytest.raises(ConfigError, match="the mesh needs 4 devices, but 2 are available"):
        commands.check_mesh(MeshConfig(devices=2, fsdp=4))
    with pytest.raises(ConfigError, match=r"MeshConfig\.devices = 9: this process has 8"):
        commands.check_mesh(MeshConfig(devices=9))
    with pytest.raises(ConfigError, match=r"MeshConfig\.devices = -2: expected int \(>= -1\)"):
        MeshConfig(devices=-2)


def test_several_processes_refuse_it(monkeypatch, capsys):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    from jaxrl_llm.learner.run import _check_one_process

    parse_gin([], ["MeshConfig.devices = 1"])
    with pytest.raises(ConfigError, match=r"MeshConfig.devices = 1 runs on one process only"):
        _check_one_process(RLConfig())
    assert cli.main(["plan", "--devices=8", "--devices-per-host=4",
                     "--gin_param=MeshConfig.devices=4"]) == 2  # fmt: skip
    assert "MeshConfig.devices = 4 runs on one process only" in capsys.readouterr().err


def test_plan_takes_the_runs_devices(capsys):
    import json

    assert cli.main(["plan", "--devices=8", "--json", "--gin_param=MeshConfig.devices=2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1}
    assert cli.main(["plan", "--devices=8", "--gin_param=MeshConfig.devices=16"]) == 2
    assert "MeshConfig.devices = 16: the plan (--devices) has 8 devices" in capsys.readouterr().err


@pytest.mark.slow  # measured: 11-14 s a case (a one-step run)
@pytest.mark.parametrize(("devices", "rollout"), [(1, 0), (3, 1)])
def test_a_run_lives_on_its_devices_only(tmp_path, devices, rollout):
    """The trainer's params, the optimizer state and the sampler's weights are on the first
    `devices` devices (the sampler's on the last `rollout` of them), and a step trains."""
    register_test_rewards()
    parse_gin([], [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{tmp_path / 'run'}'",
                   "RLConfig.steps = 1", "RLConfig.save_every = 0",
                   f"MeshConfig.devices = {devices}",
                   f"MeshConfig.rollout_devices = {rollout}"])  # fmt: skip
    run = build_run(RLConfig())
    try:
        own = set(jax.devices()[:devices])
        trainer = set(run.learner.mesh.devices.flat)
        assert len(trainer) == devices - rollout and trainer <= own
        state = run.learner.state.policy
        placed = {d for x in jax.tree.leaves(state) for d in x.sharding.device_set}
        assert placed == trainer
        engine = run.rollout.sampler.engine  # pyright: ignore[reportAttributeAccessIssue]
        sampler = {d for s in jax.tree.leaves(engine.param_shardings) for d in s.device_set}
        assert sampler <= own and (sampler == trainer) == (rollout == 0)
    except BaseException:
        close_run(run)
        raise
    (record,) = train(run)  # closes the run
    assert np.isfinite(record["actor/pg_loss"]) and record["actor/grad_norm"] > 0

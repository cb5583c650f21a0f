"""Two `jaxrl-llm train` processes, each in its own folder (each host's own disk), given the
same relative `--run_dir` as `tpu_scripts/launch.sh` gives every worker: both stop at
start-up with one configuration error line, instead of hanging at the first checkpoint
(Orbax waited 10 minutes for process 0's folders to appear on the other host's disk).
The shared case, and who writes what: tests/learner/test_shared_run_dir.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TIMEOUT_S = 120  # start-up of two processes on a busy two-core host; the check is instant
ARGS = [
    "--gin_file=grpo_tiny.gin", "--gin_param=RLConfig.steps=2",
    "--gin_param=RLConfig.save_every=1", "--gin_param=RLConfig.eval_every=0",
    "--gin_param=DataConfig.prompts_per_step=2", "--gin_param=RolloutConfig.n=2",
    "--gin_param=RolloutConfig.max_new_tokens=8", "--gin_param=AlgoConfig.mini_batches=1",
    "--gin_param=AlgoConfig.micro_batch_size=4", "--gin_param=DataConfig.val_size=0",
    "--gin_param=RolloutConfig.max_slots=4", "--run_dir=runs/x",
]  # fmt: skip


def test_a_run_dir_on_each_hosts_own_disk_stops_both_hosts_with_one_line(tmp_path, reserve_port):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXRL_NUM_PROCESSES="2",
               JAXRL_COORDINATOR_ADDRESS=f"127.0.0.1:{reserve_port()}")  # fmt: skip
    env.pop("JAXRL_DISTRIBUTED", None)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=2"])
    procs = []
    for i in range(2):
        (tmp_path / f"h{i}").mkdir()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "jaxrl_llm.cli", "train", *ARGS],
            env={**env, "JAXRL_PROCESS_ID": str(i)}, cwd=tmp_path / f"h{i}",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    try:
        outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the hosts still ran {TIMEOUT_S}s after start (the run was not refused)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 2, err[-3000:]
        errors = [x for x in err.splitlines() if "configuration error" in x]
        assert len(errors) == 1, err[-3000:]
        assert errors[0].startswith(
            "jaxrl-llm train: configuration error: run_dir runs/x is not shared by every host"
        ), errors[0]
        assert "process 1 cannot read" in errors[0] and "Traceback" not in err
    assert list(Path(tmp_path / "h0/runs/x").iterdir()) == []
    assert not (tmp_path / "h1/runs").exists()

"""SIGTERM stops a distributed `train` (exit 143) as it stops every other command.

`jax.distributed.initialize` installs JAX's preemption notifier, a C++ SIGTERM handler,
over the one the command line set before the command ran; the run then swallowed SIGTERM
and trained to its last step. One process with a coordinator is enough to show it: it takes
the same `initialize_distributed` path as each host of a pod."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

# The tiny run, small steps, enough of them that it cannot finish while being stopped.
TRAIN_ARGS = [
    "--gin_file=grpo_tiny.gin", "--gin_param=RLConfig.steps=1000",
    "--gin_param=RLConfig.save_every=0", "--gin_param=RLConfig.eval_every=0",
    "--gin_param=DataConfig.prompts_per_step=2", "--gin_param=RolloutConfig.n=2",
    "--gin_param=RolloutConfig.max_new_tokens=8", "--gin_param=AlgoConfig.mini_batches=1",
    "--gin_param=AlgoConfig.micro_batch_size=4", "--gin_param=DataConfig.val_size=0",
    "--gin_param=RolloutConfig.max_slots=4",
]  # fmt: skip
START_S = 240  # start-up and the first step's compiles on a busy two-core host
STOP_S = 30  # SIGTERM to exit: the default run, stopped mid-step, exits in about 4 s


def _wait_for(log, text: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if text in log.read_text():
            return
        time.sleep(0.5)
    pytest.fail(f"no {text!r} within {timeout_s}s (exit {proc.poll()}):\n{log.read_text()[-3000:]}")


def test_sigterm_stops_a_distributed_train(tmp_path, reserve_port):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXRL_NUM_PROCESSES="1", JAXRL_PROCESS_ID="0",
               JAXRL_COORDINATOR_ADDRESS=f"127.0.0.1:{reserve_port()}")  # fmt: skip
    env.pop("JAXRL_DISTRIBUTED", None)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=1"])
    log = tmp_path / "log"
    argv = [sys.executable, "-m", "jaxrl_llm.cli", "train", *TRAIN_ARGS,
            f"--run_dir={tmp_path / 'run'}"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(log, "jax.distributed.initialize(", proc, START_S)
        _wait_for(log, "step 1:", proc, START_S)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            steps = [x for x in log.read_text().splitlines() if "rl_loop: step" in x]
            pytest.fail(f"still training {STOP_S}s after SIGTERM; last: {steps[-1:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "jaxrl-llm: SIGTERM: stopping" in text and "Traceback" not in text, text[-3000:]

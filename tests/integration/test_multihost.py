"""Two CPU processes x 2 devices (gloo) == one process x 4 devices, for one GRPO policy update.

Each run is a subprocess of `multihost_worker.py` (JAX reads the device count at start-up, and
the test process already has 8 devices). The worker runs the real `make_policy_step` on two
4-device layouts (fsdp=4 across both processes; data=2 x fsdp=2) with per-host batch rows.

Tolerance: rtol 1e-5 on losses, metrics and updated parameters; atol 1e-6 because
`actor/loss` is a near-cancelling difference (~6e-5) and Adam's first update is ~lr * sign(g).
Cross-process collectives (gloo) may sum in a different order than in-process ones; measured
here the difference is at most one float32 ulp on metrics and <1e-8 on parameters.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("multihost_worker.py")
TIMEOUT_S = 300
RTOL, ATOL = 1e-5, 1e-6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]  # fmt: skip
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    for k in ("JAXRL_COORDINATOR_ADDRESS", "JAXRL_NUM_PROCESSES", "JAXRL_PROCESS_ID",
              "JAXRL_DISTRIBUTED"):  # fmt: skip
        env.pop(k, None)
    return env


def _start(args: list[str], devices: int, log: Path) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, str(WORKER), *args], env=_env(devices), stdout=f,
            stderr=subprocess.STDOUT, cwd=WORKER.parents[2],
        )  # fmt: skip


def _tail(log: Path, n: int = 3000) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(x for x in text.splitlines() if "Involuntary full remat" not in x)[-n:]


def test_two_processes_match_one_process(tmp_path):
    port = _free_port()
    ref_out, mh_out = tmp_path / "ref.json", tmp_path / "mh.json"
    procs: list[tuple[subprocess.Popen, Path]] = []
    try:
        log = tmp_path / "ref.log"
        procs.append((_start(["--out", str(ref_out)], 4, log), log))
        for i in range(2):
            log = tmp_path / f"p{i}.log"
            args = ["--out", str(mh_out), "--coordinator", f"127.0.0.1:{port}",
                    "--num-processes", "2", "--process-id", str(i)]  # fmt: skip
            procs.append((_start(args, 2, log), log))
        deadline = time.monotonic() + TIMEOUT_S
        for proc, log in procs:
            try:
                rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{log.stem} still running after {TIMEOUT_S}s:\n{_tail(log)}")
            assert rc == 0, f"{log.stem} exited {rc}:\n{_tail(log)}"
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    ref, mh = json.loads(ref_out.read_text()), json.loads(mh_out.read_text())
    assert (ref["process_count"], ref["device_count"]) == (1, 4)
    assert (mh["process_count"], mh["device_count"], mh["local_device_count"]) == (2, 4, 2)
    ref_arrays = np.load(ref_out.with_suffix(".npz"))
    mh_arrays = np.load(mh_out.with_suffix(".npz"))
    assert sorted(ref_arrays.files) == sorted(mh_arrays.files)

    for layout, r in ref["layouts"].items():
        m = mh["layouts"][layout]
        # Process 0 contributed only its half of every micro-batch; the weights span both hosts.
        assert m["rows_of_this_process"] == [0, 4] and r["rows_of_this_process"] == [0, 8]
        assert not m["q_proj_fully_addressable"] and m["q_proj_spec"] == r["q_proj_spec"]
        assert m["step"] == r["step"] == 1 and m["metrics"]["actor/skipped"] == 0.0
        assert m["metrics"] == m["metrics_direct"]  # float() of replicated scalars works
        assert r["metrics"].keys() == m["metrics"].keys()
        for k, v in r["metrics"].items():
            np.testing.assert_allclose(m["metrics"][k], v, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{layout} {k}")  # fmt: skip
        for name in (f for f in ref_arrays.files if f.startswith(f"{layout}:")):
            np.testing.assert_allclose(mh_arrays[name], ref_arrays[name], rtol=RTOL,
                                       atol=ATOL, err_msg=name)  # fmt: skip

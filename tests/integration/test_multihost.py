"""Two CPU processes x 2 devices (gloo) == one process x 4 devices.

1. One GRPO policy update (`multihost_worker.py`): the real `make_policy_step` on two
   4-device layouts (fsdp=4 across both processes; data=2 x fsdp=2) with per-host batch rows.
2. The whole RL loop (`multihost_rl_worker.py`): `run_rl` with per-host rollout, gathered
   experience, a reference model, validation, a checkpoint, and a resume on both hosts;
   synchronous and overlapped (`RLConfig.max_staleness = 1`).
3. Tagged host exchanges from a thread beside the main thread's collectives
   (`exchange_worker.py`), as the overlapped producer makes them.

Each run is a subprocess (JAX reads the device count at start-up, and the test process
already has 8 devices).

Tolerance: rtol 1e-5 on losses, metrics and updated parameters; atol 1e-6 because
`actor/loss` is a near-cancelling difference (~6e-5) and Adam's first update is ~lr * sign(g).
Cross-process collectives (gloo) may sum in a different order than in-process ones; measured
here the difference is at most one float32 ulp on metrics and <1e-8 on parameters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("multihost_worker.py")
RL_WORKER = Path(__file__).with_name("multihost_rl_worker.py")
EXCHANGE_WORKER = Path(__file__).with_name("exchange_worker.py")
TIMEOUT_S = 300
RTOL, ATOL = 1e-5, 1e-6


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


def _start(args: list[str], devices: int, log: Path, worker: Path = WORKER,
           **env: str) -> subprocess.Popen:  # fmt: skip
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, str(worker), *args], env={**_env(devices), **env}, stdout=f,
            stderr=subprocess.STDOUT, cwd=WORKER.parents[2],
        )  # fmt: skip


def _wait_all(procs: list[tuple[subprocess.Popen, Path]]) -> None:
    """Wait for every process; fail with the log of the first that failed or hung."""
    try:
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


def _tail(log: Path, n: int = 3000) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(x for x in text.splitlines() if "Involuntary full remat" not in x)[-n:]


def test_two_processes_match_one_process(tmp_path, reserve_port):
    port = reserve_port()
    ref_out, mh_out = tmp_path / "ref.json", tmp_path / "mh.json"
    procs: list[tuple[subprocess.Popen, Path]] = []
    log = tmp_path / "ref.log"
    procs.append((_start(["--out", str(ref_out)], 4, log), log))
    for i in range(2):
        log = tmp_path / f"p{i}.log"
        args = ["--out", str(mh_out), "--coordinator", f"127.0.0.1:{port}",
                "--num-processes", "2", "--process-id", str(i)]  # fmt: skip
        procs.append((_start(args, 2, log), log))
    _wait_all(procs)

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


def test_tagged_exchanges_from_a_thread_beside_cross_host_collectives(tmp_path, reserve_port):
    """`hosts.exchange_objects` (the coordination service) from a second thread while the
    main thread runs cross-host device collectives, on two processes: every exchange returns
    both hosts' objects in process order, payloads of several parts (over 1 MiB) arrive
    whole, and the parts are deleted after (a second round with the same data works)."""
    port = reserve_port()
    procs = []
    for i in range(2):
        log = tmp_path / f"x{i}.log"
        args = ["--out", str(tmp_path / "x"), "--coordinator", f"127.0.0.1:{port}",
                "--process-id", str(i)]  # fmt: skip
        procs.append((_start(args, 2, log, EXCHANGE_WORKER), log))
    _wait_all(procs)
    for i in range(2):
        got = json.loads((tmp_path / f"x.p{i}.json").read_text())
        # Exchange t: process p sent an array of 300_000 + p float64s, all 100 * t + p.
        assert got["exchanges"] == [[[100 * t + p, 300_000 + p] for p in range(2)]
                                    for t in range(6)]  # fmt: skip
        assert got["collectives"] == [[[0, c], [1, c]] for c in range(40)]
        assert got["keys_left"] == []


def _rl_jobs(
    tmp_path: Path, reserve_port: Callable[[], int], *jobs: tuple[str, int, list[str]]
) -> list[list[dict]]:
    """Run `run_rl` jobs side by side, each on `processes` x (4 / processes) devices (name,
    processes, worker args); for each job, every process's result JSON."""
    procs, outs = [], []
    for name, processes, args in jobs:
        port, out, run = reserve_port(), tmp_path / name, tmp_path / "runs" / name.split("-")[0]
        for i in range(processes):
            env = {}
            if processes > 1:
                env = dict(JAXRL_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                           JAXRL_NUM_PROCESSES=str(processes), JAXRL_PROCESS_ID=str(i))  # fmt: skip
            log = tmp_path / f"{name}.p{i}.log"
            argv = ["--run-dir", str(run), "--out", str(out), *args]
            procs.append((_start(argv, 4 // processes, log, RL_WORKER, **env), log))
        outs.append([Path(f"{out}.p{i}.json") for i in range(processes)])
    _wait_all(procs)
    return [[json.loads(p.read_text()) for p in job] for job in outs]


def _values(records: list[dict]) -> dict[tuple[int, str], float]:
    return {(r["step"], k): v for r in records for k, v in r.items()
            if not k.startswith(("timing/", "perf/"))}  # fmt: skip


def test_rl_loop_on_two_hosts_matches_one_host_and_resumes(tmp_path, reserve_port):
    """Each host samples its share of the prompts on its own devices; the gathered batch, the
    losses, validation and the resumed step equal a one-process run of the same config."""
    _two_hosts_match_one_host_and_resume(tmp_path, reserve_port, [], lag=[0, 0, 0])


def test_an_overlapped_rl_loop_on_two_hosts_matches_one_host_and_resumes(tmp_path, reserve_port):
    """The same with `RLConfig.max_staleness = 1`: each host's producer thread samples the
    next step while the trainer's thread updates across both hosts (weights staged on the
    trainer's thread, the hosts' samples exchanged by tag: learner/overlap.py); a run is as
    deterministic as a synchronous one, so it equals the one-process overlapped run, and the
    checkpoint at step 2 holds step 3's batch, sampled ahead, which the resumed hosts train."""
    k1 = ["--gin", "RLConfig.max_staleness = 1"]
    _two_hosts_match_one_host_and_resume(tmp_path, reserve_port, k1, lag=[0, 1, 1])


def _two_hosts_match_one_host_and_resume(
    tmp_path: Path, reserve_port: Callable[[], int], args: list[str], lag: list[int]
) -> None:
    jobs = ("ref", 1, args), ("mh-a", 2, [*args, "--stop-after", "2"])
    (ref,), first = _rl_jobs(tmp_path, reserve_port, *jobs)
    (resumed,) = _rl_jobs(tmp_path, reserve_port, ("mh-b", 2, [*args, "--resume"]))
    assert [(r["process_count"], r["device_count"]) for r in first] == [(2, 4), (2, 4)]
    assert first[0]["local_device_count"] == 2 and ref["process_count"] == 1

    # Both hosts took the same decisions and logged the same numbers.
    for a, b in (first, resumed):
        assert _values(a["records"]) == _values(b["records"])
    mh = _values(first[0]["records"]) | _values(resumed[0]["records"])
    want = _values(ref["records"])
    assert [r["step"] for r in resumed[0]["records"]] == [3]
    assert mh.keys() == want.keys()
    exact = ("critic/score/", "response_length/", "rollout/finish/", "batch/", "val/",
             "dynamic_sampling/", "step", "actor/lr_step")  # fmt: skip
    for (step, key), v in want.items():
        if key.startswith(exact):  # the same samples: per-sample seeds follow the global row
            assert mh[(step, key)] == v, (step, key)
        elif key.startswith("rollout/logprob_diff/") and not lag[step - 1]:
            # engine vs trainer float noise (with a lag: the policy moved, compared below)
            assert mh[(step, key)] < 1e-4 and v < 1e-4, (step, key)
        else:  # float noise of different batch layouts
            np.testing.assert_allclose(mh[(step, key)], v, rtol=1e-4, atol=1e-6,
                                       err_msg=f"step {step} {key}")  # fmt: skip
    assert any(want[(s, "critic/advantages/max")] > 0 for s in (1, 2, 3))  # a real signal
    # Step s sampled with the weights after max(0, s - 1 - k) updates.
    assert [mh[(s, "rollout/staleness/max")] for s in (1, 2, 3)] == lag

    # Process 0 alone wrote the run's files; the checkpoint and the export are complete.
    run = tmp_path / "runs" / "mh"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 3]
    assert sorted(p.name for p in (run / "samples").iterdir()) == [
        "step_1.jsonl", "step_2.jsonl", "step_3.jsonl"]  # fmt: skip
    assert (run / "hf" / "model.safetensors").exists()
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == [
        2, 3]  # fmt: skip

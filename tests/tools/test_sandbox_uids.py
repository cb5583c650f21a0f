"""Per-run sandbox uids are unique on the host, not only in one process: RLIMIT_NPROC counts
a uid's tasks system-wide, so two trainers (or a trainer and an eval) sharing a uid would
share one fork budget, and one's fork bomb would starve the other's runs."""

import subprocess
import sys
import threading
import time

import pytest

from jaxrl_llm.tools import SandboxConfig, run_python, sandbox
from jaxrl_llm.tools.sandbox_uids import claim_slot

# Holds slot(s) of the lock directory argv[1] until its stdin closes.
HOLD = """
import sys
from jaxrl_llm.tools.sandbox_uids import claim_slot
with claim_slot(sys.argv[1]) as slot:
    print(slot, flush=True)
    sys.stdin.read()
"""
# Runs a fork bomb through the sandbox (the default lock directory), saying when it starts.
BOMB = """
import sys
from jaxrl_llm.tools import SandboxConfig, bwrap_available, run_python
assert bwrap_available()  # probed before the start is announced
config = SandboxConfig(backend="bwrap", timeout_s=float(sys.argv[1]), max_processes=16)
print("start", flush=True)
bomb = "import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass"
run_python(bomb, config=config)
"""
FORK = "import os\np = os.fork()\nif p == 0:\n    os._exit(0)\nos.waitpid(p, 0)\nprint('forked')"


def test_slots_are_unique_across_processes_and_freed_when_one_dies(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "0\n"
        with claim_slot(tmp_path) as first, claim_slot(tmp_path) as second:
            assert (first, second) == (1, 2)
    finally:
        holder.kill()  # no clean exit: the kernel drops its lock
        holder.wait()
    with claim_slot(tmp_path) as slot:
        assert slot == 0


def test_concurrent_threads_get_distinct_slots(tmp_path):
    seen: list[int] = []
    barrier = threading.Barrier(6)

    def run():
        with claim_slot(tmp_path) as slot:
            seen.append(slot)
            barrier.wait()

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(6))


@pytest.mark.skipif(
    sandbox._bwrap_mode(SandboxConfig(backend="bwrap")) != "privileged",
    reason="per-run uids are used when bubblewrap runs as root",
)
def test_a_fork_bomb_in_another_process_does_not_starve_this_ones_runs():
    bomber = subprocess.Popen([sys.executable, "-c", BOMB, "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert bomber.stdout is not None and bomber.stdout.readline() == "start\n"
        time.sleep(1.5)  # the bomb has filled its run's process budget
        config = SandboxConfig(backend="bwrap", timeout_s=10, max_processes=16)  # the bomb's
        result = run_python(FORK, config=config)
        assert result.ok and result.stdout == "forked\n", result
    finally:
        bomber.wait(timeout=60)

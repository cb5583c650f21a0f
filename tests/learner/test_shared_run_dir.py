"""A multi-host `train` refuses a run directory its hosts do not share, with one line on
every host, before anything but a marker is written there.

Orbax's multi-host save has process 0 make a checkpoint's folders and the other hosts wait
for them to appear; on a local disk (a relative `--run_dir` on each TPU VM) they never do,
and the run hung at its first save for Orbax's 10 minutes. Two hosts are faked here by two
threads, each its own `jax.process_index`, exchanging through a barrier as
`sharding.hosts.allgather_objects` does across processes; "local disks" are two different
folders. (The real two-process run: tests/integration/test_multihost_rundir.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

import jax
import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.learner import commands
from jaxrl_llm.sharding import hosts

HOSTS = 2


@pytest.fixture
def two_hosts(monkeypatch):
    """Runs `fn(process_index)` on each of two fake hosts; returns what each returned or
    raised."""
    me = threading.local()
    slots: list = [None] * HOSTS
    barrier = threading.Barrier(HOSTS, timeout=30)

    def allgather(obj, tag=None):
        slots[me.index] = obj
        barrier.wait()
        everyone = list(slots)
        barrier.wait()  # nobody overwrites a slot before every host has read it
        return everyone

    monkeypatch.setattr(jax, "process_count", lambda: HOSTS)
    monkeypatch.setattr(jax, "process_index", lambda: me.index)
    monkeypatch.setattr(hosts, "allgather_objects", allgather)

    def run(fn) -> list:
        results: list = [None] * HOSTS

        def host(i: int) -> None:
            me.index = i
            try:
                results[i] = fn(i)
            except Exception as e:  # handed to the test to check
                results[i] = e  # a host failing alone: the other's barrier times out

        threads = [threading.Thread(target=host, args=(i,)) for i in range(HOSTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    return run


def test_a_shared_run_dir_passes_and_keeps_no_marker(two_hosts, tmp_path):
    run = tmp_path / "run"
    assert two_hosts(lambda i: commands.check_shared_run_dir(str(run))) == [None, None]
    assert run.is_dir() and list(run.iterdir()) == []


def test_a_run_dir_on_each_hosts_own_disk_is_one_config_error_on_every_host(two_hosts, tmp_path):
    dirs = [tmp_path / f"host{i}" / "runs" / "x" for i in range(HOSTS)]
    errors = two_hosts(lambda i: commands.check_shared_run_dir(str(dirs[i])))
    for i, e in enumerate(errors):
        assert isinstance(e, ConfigError), (i, e)
        message = str(e)
        assert "\n" not in message
        assert message.startswith(f"run_dir {dirs[i]} is not shared by every host"), message
        assert "process 1 cannot read" in message
        assert "gs:// path or a shared filesystem" in message
    assert list(dirs[0].iterdir()) == []  # process 0's marker is removed
    assert not dirs[1].exists()  # nothing written on the host that could not see it


def test_a_run_dir_process_0_cannot_write_is_one_config_error_on_every_host(two_hosts, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = blocker / "run"  # under a file: not a folder anyone can make
    errors = two_hosts(lambda i: commands.check_shared_run_dir(str(run)))
    for e in errors:
        assert isinstance(e, ConfigError), e
        assert str(e).startswith(f"run_dir {run}: process 0 cannot write there"), str(e)
        assert "\n" not in str(e)


def test_one_process_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    commands.check_shared_run_dir(str(tmp_path / "run"))
    assert not Path(tmp_path / "run").exists()

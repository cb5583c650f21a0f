"""`jaxrl_llm.huge_pages`: when the `jaxrl-llm` program starts itself again with glibc's
huge-page tunable, and that the restarted process does get 2 MiB pages for a large malloc."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxrl_llm import huge_pages
from jaxrl_llm.huge_pages import STARTED, TUNABLE, huge_page_env, thp_mode

GLIBC = (2, 36)


@pytest.mark.parametrize(
    ("env", "mode", "glibc", "platform"),
    [
        ({}, "always", GLIBC, "linux"),  # every large mapping is huge already
        ({}, "never", GLIBC, "linux"),  # none can be
        ({}, None, GLIBC, "linux"),  # no THP in this kernel
        ({}, "madvise", (2, 34), "linux"),  # glibc without the tunable
        ({}, "madvise", None, "linux"),  # musl
        ({}, "madvise", GLIBC, "darwin"),
        ({"GLIBC_TUNABLES": f"{TUNABLE}=0"}, "madvise", GLIBC, "linux"),  # the user's choice
        ({"JAXRL_LLM_HUGE_PAGES": "0"}, "madvise", GLIBC, "linux"),  # the opt-out
        ({STARTED: "1"}, "madvise", GLIBC, "linux"),  # restarted once already
    ],
)
def test_no_restart_where_it_would_change_nothing(env, mode, glibc, platform):
    assert huge_page_env(env, mode, glibc, platform) is None


def test_the_tunable_is_added_to_the_environment_and_to_tunables_set_before():
    new = huge_page_env({"PATH": "/bin"}, "madvise", GLIBC, "linux")
    assert new == {"PATH": "/bin", "GLIBC_TUNABLES": f"{TUNABLE}=1", STARTED: "1"}
    mine = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    new = huge_page_env(mine, "madvise", GLIBC, "linux")
    assert new is not None
    assert new["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}=1"
    assert mine == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}  # the caller's, untouched


@pytest.mark.parametrize(
    ("text", "mode"),
    [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"), ("", None)],
)
def test_thp_mode_is_the_bracketed_word(tmp_path, text, mode):
    (tmp_path / "enabled").write_text(text)
    assert thp_mode(tmp_path / "enabled") == mode
    assert thp_mode(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("tunables", "mode", "on"),
    [
        (f"{TUNABLE}=1", "madvise", True),
        (f"glibc.malloc.arena_max=2:{TUNABLE}=1", "madvise", True),
        (f"{TUNABLE}=0", "madvise", False),
        ("", "madvise", False),
        ("", "always", True),
        (f"{TUNABLE}=1", "never", False),
    ],
)
def test_in_effect_reads_the_mode_and_the_tunable(tunables, mode, on):
    assert huge_pages.in_effect({"GLIBC_TUNABLES": tunables}, mode) is on


# Restarts itself (same command line) when huge_pages says so, then mallocs and touches 64 MiB
# and reports the environment and the process's anonymous huge pages.
_CHILD = textwrap.dedent(
    """
    import ctypes, json, os, sys
    from jaxrl_llm import huge_pages
    huge_pages.reexec_with_huge_pages()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    size = 64 << 20
    buf = libc.malloc(size)
    ctypes.memset(buf, 1, size)
    rollup = open("/proc/self/smaps_rollup").read().split("\\n")
    huge = [int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:")]
    print(json.dumps([os.environ.get("GLIBC_TUNABLES", ""), huge[0] if huge else 0, sys.argv[1:]]))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and glibc are Linux's")
def test_the_restarted_process_has_the_tunable_its_arguments_and_huge_pages():
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", STARTED)}
    expected = huge_page_env(env, thp_mode(), huge_pages.glibc_version())
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, "train", "--flag"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    tunables, huge_kb, argv = json.loads(out)
    assert argv == ["train", "--flag"]
    if expected is None:  # this host's malloc is left alone
        assert tunables == ""
        return
    assert tunables == f"{TUNABLE}=1"
    assert huge_kb >= 2048, "64 MiB malloc'd and touched, not one 2 MiB page"

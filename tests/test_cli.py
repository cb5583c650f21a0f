"""The command line's process behaviour: a SIGTERM runs the command's cleanups on the way out."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from jaxrl_llm import cli

# A command that holds a temporary directory (as `bench train` holds its 0.5B checkpoint)
# and waits to be stopped.
HOLD_MODULE = """
import pathlib, sys, tempfile, time

def add_arguments(parser):
    parser.add_argument("--dir")

def main(args):
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        (pathlib.Path(tmp) / "model.safetensors").write_bytes(b"0" * 4096)
        print(tmp, flush=True)
        time.sleep(120)
    return 0
"""


def test_a_terminated_command_removes_its_temporary_files(tmp_path):
    (tmp_path / "hold_cmd.py").write_text(HOLD_MODULE)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    child = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from jaxrl_llm import cli
        cli.COMMANDS["hold"] = ("hold_cmd", "holds a temporary directory")
        sys.exit(cli.main(["hold", "--dir", {str(scratch)!r}]))
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        held = Path(proc.stdout.readline().strip())
        assert (held / "model.safetensors").exists()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        code = proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + signal.SIGTERM
    assert "SIGTERM: stopping" in err and "Traceback" not in err
    assert not held.exists() and list(scratch.iterdir()) == []


def test_the_handler_is_only_set_while_a_command_runs(tmp_path, monkeypatch):
    (tmp_path / "probe_cmd.py").write_text(
        "import signal\n"
        "SEEN = []\n"
        "def add_arguments(parser): pass\n"
        "def main(args):\n"
        "    SEEN.append(signal.getsignal(signal.SIGTERM))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "probe", ("probe_cmd", "records the SIGTERM handler"))
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["probe"]) == 0
    seen = sys.modules["probe_cmd"].SEEN
    if before is signal.SIG_DFL:
        assert seen == [cli._raise_exit]
    else:  # someone else's handler (a test runner's) is left as it was
        assert seen == [before]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_command_started_off_the_main_thread_leaves_signals_alone():
    result = []
    thread = threading.Thread(target=lambda: result.append(cli._exit_cleanly_on_sigterm()))
    thread.start()
    thread.join()
    assert result == [False]

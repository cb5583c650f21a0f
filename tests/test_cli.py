"""The command line's process behaviour: a SIGTERM runs the command's cleanups on the way out;
a bad path ends a command with one line and exit 2."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import gin
import pytest

from jaxrl_llm import cli
from jaxrl_llm.assets import builtin_checkpoint

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


def _start_command(folder: Path, module: str, args: list[str]) -> subprocess.Popen:
    """`jaxrl-llm <module> <args>` in a child process, the command being `folder/module.py`."""
    child = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(folder)!r})
        from jaxrl_llm import cli
        cli.COMMANDS["probe"] = ({module!r}, "a test's command")
        sys.exit(cli.main(["probe", *{args!r}]))
    """)
    return subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_terminated_command_removes_its_temporary_files(tmp_path):
    (tmp_path / "hold_cmd.py").write_text(HOLD_MODULE)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = _start_command(tmp_path, "hold_cmd", ["--dir", str(scratch)])
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


# A command whose cleanup takes a while (as an overlapped run's producer closing, then the
# run's last checkpoint): it says when the cleanup starts and writes a file when it ends.
SLOW_CLEANUP_MODULE = """
import pathlib, sys, time

def add_arguments(parser):
    parser.add_argument("--done")

def main(args):
    try:
        print("running", flush=True)
        time.sleep(120)
    finally:
        print("cleaning", flush=True)
        time.sleep(1.0)
        pathlib.Path(args.done).write_text("closed")
    return 0
"""


def test_a_second_sigterm_does_not_cut_the_cleanup_short(tmp_path):
    (tmp_path / "slow_cmd.py").write_text(SLOW_CLEANUP_MODULE)
    done = tmp_path / "done"
    proc = _start_command(tmp_path, "slow_cmd", ["--done", str(done)])
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().strip() == "cleaning"
        proc.send_signal(signal.SIGTERM)  # mid-cleanup
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert done.read_text() == "closed"
    assert "SIGTERM: stopping" in err and "SIGTERM again: still stopping" in err
    assert "Traceback" not in err


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


def test_a_commands_own_handler_is_removed_when_it_returns(tmp_path, monkeypatch):
    """A command that sets its own SIGTERM handler (as `serve` does) leaves none behind: the
    default is back once it returns, as after any other command."""
    (tmp_path / "own_cmd.py").write_text(
        "import signal\n"
        "def add_arguments(parser): pass\n"
        "def main(args):\n"
        "    signal.signal(signal.SIGTERM, lambda *_: None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "own", ("own_cmd", "sets its own SIGTERM handler"))
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a process of its own
    try:
        assert cli.main(["own"]) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_command_started_off_the_main_thread_leaves_signals_alone():
    result = []
    thread = threading.Thread(target=lambda: result.append(cli._exit_cleanly_on_sigterm()))
    thread.start()
    thread.join()
    assert result == [False]


@pytest.fixture
def clean_gin():
    yield
    gin.clear_config()


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, the start of the one line on stderr)."""
    missing = tmp / "missing"
    corrupt = tmp / "corrupt"
    shutil.copytree(builtin_checkpoint(), corrupt)
    (corrupt / "tokenizer.json").write_text("{not json")
    run = ["--run_dir", str(tmp / "run"), "--gin_param"]
    return {
        "train_data_file": (
            ["train", *run, f"DataConfig.train_file = '{missing}.jsonl'"],
            f"jaxrl-llm train: configuration error: DataConfig.train_file = '{missing}.jsonl': "
            "no such file or folder; expected a prompt file (.jsonl, .json, .parquet, .arrow) "
            "or a Hugging Face dataset folder; fix the path",
        ),
        "train_checkpoint": (
            ["train", *run, f"PolicyConfig.checkpoint = '{missing}'"],
            f"jaxrl-llm train: configuration error: PolicyConfig.checkpoint = '{missing}': "
            "no such folder; expected a Hugging Face checkpoint folder",
        ),
        "generate_checkpoint": (
            ["generate", "--checkpoint", str(missing)],
            f"jaxrl-llm generate: configuration error: --checkpoint '{missing}': no such folder",
        ),
        "generate_tokenizer": (
            ["generate", "--checkpoint", str(corrupt)],
            f"jaxrl-llm generate: configuration error: --checkpoint '{corrupt}': "
            "tokenizer.json is not valid JSON",
        ),
        "export_run": (
            ["export", "--run", str(missing), "--out", str(tmp / "out")],
            f"jaxrl-llm export: configuration error: --run '{missing}': no such folder; "
            "expected a jaxrl-llm run directory",
        ),
    }


BAD_INPUTS = ("train_data_file", "train_checkpoint", "generate_checkpoint")
BAD_INPUTS += ("generate_tokenizer", "export_run")


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_path_ends_the_command_with_one_line(tmp_path, capsys, clean_gin, case):
    argv, line = _bad_inputs(tmp_path)[case]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(line), err[-1]
    assert "Traceback" not in "\n".join(err)


@pytest.mark.slow  # 9 s in a loaded 2-worker run, AMD EPYC AVX2
def test_a_missing_checkpoint_ends_the_process_without_a_traceback(tmp_path):
    """In its own process (`python -m jaxrl_llm.cli`, as the entry point): exit 2, one line."""
    missing = tmp_path / "missing"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_llm.cli", "generate", "--checkpoint", str(missing)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"jaxrl-llm generate: configuration error: --checkpoint '{missing}': no such folder; "
        "expected a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json) "
        "or 'builtin'; fix the path"
    ]


def test_the_compile_cache_defaults_to_the_user_cache_and_yields_to_jax_settings(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert cli.compile_cache(env) == str(tmp_path / "jaxrl-llm" / "xla")
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jaxrl-llm" / "xla")
    assert env["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(cli.CACHE_MAX_BYTES)
    mine = {"XDG_CACHE_HOME": str(tmp_path), "JAX_COMPILATION_CACHE_DIR": "gs://b/xla"}
    assert cli.compile_cache(mine) is None and mine["JAX_COMPILATION_CACHE_DIR"] == "gs://b/xla"
    (tmp_path / "file").write_text("")  # a cache home that cannot hold a folder
    blocked = {"XDG_CACHE_HOME": str(tmp_path / "file")}
    assert cli.compile_cache(blocked) is None and "JAX_COMPILATION_CACHE_DIR" not in blocked


def test_jax_writes_its_programs_to_the_default_compile_cache(tmp_path):
    """In a fresh interpreter, as the `jaxrl-llm` program: the folder set before JAX starts is
    the one JAX's persistent cache writes (every program cached here: threshold 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env |= {"XDG_CACHE_HOME": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    code = (
        "from jaxrl_llm import cli; cli.compile_cache(); import jax, jax.numpy as jnp; "
        "jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(3)).block_until_ready()"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert any((tmp_path / "jaxrl-llm" / "xla").iterdir())

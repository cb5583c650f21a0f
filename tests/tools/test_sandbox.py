"""Ordinary behaviour of tools/sandbox.py: output, exit codes, limits, backend choice."""

import os
import site
import time

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.tools import SandboxConfig, SandboxUnavailable, run_python, sandbox
from jaxrl_llm.tools.sandbox import bwrap_available
from jaxrl_llm.tools.sandbox_types import CappedBuffer

HAVE_BWRAP = bwrap_available()
pytestmark = pytest.mark.filterwarnings("ignore:SANDBOX IS WEAK")


def test_runs_code_and_captures_both_streams():
    result = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)
    assert result.ok and not result.timed_out and result.backend in ("bwrap", "subprocess")


def test_errors_report_a_traceback_without_the_launcher():
    result = run_python("x = 1\n1 / 0\n")
    assert result.exit_code == 1 and not result.ok
    assert result.stderr.splitlines()[-1] == "ZeroDivisionError: division by zero"
    assert 'File "main.py", line 2' in result.stderr and "<string>" not in result.stderr


def test_syntax_error_and_sys_exit():
    assert "SyntaxError" in run_python("def f(:\n").stderr
    assert run_python("import sys; sys.exit(7)").exit_code == 7
    assert run_python("exit()").exit_code == 0


def test_a_lone_surrogate_in_the_code_runs_replaced():
    """Code is fed as UTF-8; a character UTF-8 cannot hold becomes "?" (never an exception)."""
    result = run_python("print('\ud800')")
    assert result.ok and result.stdout == "?\n", result


def test_stdin_is_empty_and_the_code_file_is_in_cwd():
    result = run_python("import os\nprint(repr(input.__name__))\nprint(os.listdir('.'))")
    assert "main.py" in result.stdout
    assert "EOFError" in run_python("input()").stderr


def test_large_code_is_fed_without_deadlock():
    code = "x = 0\n" + "x += 1\n" * 50_000 + "print(x)"
    result = run_python(code)
    assert result.stdout == "50000\n", result.stderr[-300:]


@pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap does not run here")
def test_import_paths_make_packages_visible_read_only():
    paths = tuple(p for p in site.getsitepackages() if os.path.isdir(os.path.join(p, "sympy")))
    if not paths:
        pytest.skip("sympy is not installed in a site-packages")
    plain = run_python("import sympy")
    assert "ModuleNotFoundError" in plain.stderr
    config = SandboxConfig(import_paths=paths)
    assert (
        run_python("import sympy; print(sympy.Rational(1, 3) * 3)", config=config).stdout == "1\n"
    )


def test_capped_buffer_keeps_head_and_tail():
    buffer = CappedBuffer(10)
    for chunk in (b"01234", b"56789", b"abcdefghij"):
        buffer.add(chunk)
    assert buffer.total == 20
    assert buffer.text() == "01234\n...[10 bytes truncated]...\nfghij"
    small = CappedBuffer(100)
    small.add(b"hi")
    assert small.text() == "hi"


def test_config_is_validated():
    with pytest.raises(ConfigError, match=r"SandboxConfig\.backend = 'docker': expected str"):
        SandboxConfig(backend="docker")
    with pytest.raises(ConfigError, match=r"SandboxConfig\.timeout_s = 0"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ConfigError, match=r"SandboxConfig\.memory_mb = 8"):
        SandboxConfig(memory_mb=8)


def test_unusable_bwrap_is_detected_at_runtime_and_refused(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: no permissions to create namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(sandbox, "_PROBE", {})
    for backend in ("auto", "bwrap"):
        with pytest.raises(SandboxUnavailable, match=r"bubblewrap does not work here.*no perm"):
            run_python("print(1)", config=SandboxConfig(backend=backend))


def test_start_latency_is_small():
    run_python("pass")
    start = time.monotonic()
    for _ in range(5):
        run_python("pass")
    assert (time.monotonic() - start) / 5 < 1.0

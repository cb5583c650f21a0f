"""The sandbox fails closed without bubblewrap (nothing runs unless "subprocess" is chosen,
which is then warned about), and its limits, import paths and backend come from gin."""

import os
import sysconfig
import time

import gin
import pytest

from jaxrl_llm.tools import (
    PythonExecutor,
    PythonTool,
    SandboxConfig,
    SandboxUnavailable,
    build_tool,
    run_python,
    sandbox,
)
from jaxrl_llm.tools.sandbox import bwrap_available

requires_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap does not run here")


@pytest.fixture
def no_bwrap(monkeypatch):
    """A machine without bubblewrap: the lookup finds nothing, the probe is redone, the
    weak-sandbox warning has not been given yet in this process, and no gin binding (see
    conftest.py) picks the backend."""
    gin.clear_config()
    which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda cmd: None if cmd == "bwrap" else which(cmd))
    monkeypatch.setattr(sandbox, "_PROBE", {})
    monkeypatch.setattr(sandbox, "_WARNED", type(sandbox._WARNED)())


def test_without_bubblewrap_nothing_runs_unless_opted_in(no_bwrap, tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')"
    refused = r"bwrap is not installed.*apt-get install bubblewrap.*SandboxConfig.backend"
    for backend in ("auto", "bwrap"):
        config = SandboxConfig(backend=backend)
        with pytest.raises(SandboxUnavailable, match=refused):
            run_python(code, config=config)
        with pytest.raises(SandboxUnavailable, match=refused):
            PythonTool(config)  # refused when the rollout builds its tool, before any step
        with PythonExecutor(config) as executor, pytest.raises(SandboxUnavailable):
            executor.submit(code).result()
    with pytest.raises(SandboxUnavailable, match=refused):
        build_tool("python")
    assert not marker.exists()
    opted_in = SandboxConfig(backend="subprocess")
    with pytest.warns(RuntimeWarning, match="SANDBOX IS WEAK.*'subprocess' was chosen"):
        result = run_python(code, config=opted_in)
    assert result.ok and result.backend == "subprocess", result
    assert marker.read_text() == "x"  # the weak backend can write the host's files
    tool = PythonTool(opted_in)  # warned once per process, not per call
    assert tool("```python\nprint(6 * 7)\n```\n```output") == "\n42\n```\n"


@requires_bwrap
def test_site_packages_are_importable_read_only_and_the_project_stays_hidden():
    config = SandboxConfig(import_paths=("site-packages",), timeout_s=20)
    code = (
        "import errno, numpy, sympy\n"
        "print(int(numpy.arange(5).sum()), sympy.Rational(1, 3) * 3)\n"
        "try:\n"
        "    open(numpy.__file__, 'a')\n"
        "except OSError as e:\n"
        "    print('refused' if e.errno in (errno.EACCES, errno.EROFS) else e)\n"
        "try:\n"
        "    import jaxrl_llm\n"
        "except ImportError:\n"
        "    print('hidden')\n"
    )
    result = run_python(code, config=config)
    assert result.stdout == "10 1\nrefused\nhidden\n", result.stderr[-500:]
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert site in config.resolved_import_paths()


def test_limits_import_paths_and_backend_come_from_gin():
    gin.clear_config()
    try:
        gin.parse_config(
            "SandboxConfig.timeout_s = 1.5\n"
            "SandboxConfig.memory_mb = 300\n"
            'SandboxConfig.import_paths = ["site-packages"]\n'
            'SandboxConfig.backend = "auto"\n'
        )
        config = PythonTool().config if bwrap_available() else SandboxConfig()
    finally:
        gin.clear_config()
    assert (config.timeout_s, config.memory_mb, config.backend) == (1.5, 300, "auto")
    assert config.import_paths == ("site-packages",)
    if bwrap_available():
        start = time.monotonic()
        result = run_python("while True: pass", config=config)
        assert result.timed_out and time.monotonic() - start < 5.0
        big = run_python("x = bytearray(400 * 2**20)", config=config)
        assert "MemoryError" in big.stderr


def test_bad_sandbox_settings_name_the_field():
    with pytest.raises(ValueError, match=r"import_paths entry 'lib': expected an existing abs"):
        SandboxConfig(import_paths=("lib",))
    with pytest.raises((TypeError, ValueError), match=r"import_paths = 'site-packages': expec"):
        SandboxConfig(import_paths="site-packages")
    with pytest.raises(ValueError, match=r"SandboxConfig\.timeout_s = 0: expected float"):
        SandboxConfig(timeout_s=0)

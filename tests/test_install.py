"""A non-editable install runs the built-in default from any directory (configs are package
data, nothing is looked up through the repository)."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import jaxrl_llm

REPO = Path(jaxrl_llm.__file__).resolve().parent.parent


def _fresh_venv(root: Path) -> Path:
    """A new venv whose dependencies come from this environment's site-packages (a .pth
    line), so `pip install .` needs neither network nor a second 2 GB install."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Lines of a .pth are appended to sys.path; .pth files in that folder are not run, so
    # this environment's editable jaxrl_llm (a finder started by a .pth) stays invisible.
    Path(purelib, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _copy_sources(dst: Path) -> Path:
    """The package and its metadata outside the repository, so the build writes nothing
    into the working tree."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("jaxrl_llm", "configs"):
        shutil.copytree(REPO / package, dst / package, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dst / name)
    return dst


@pytest.mark.slow  # measured: 35 s (the install, then a one-step run)
def test_pip_install_runs_the_default_from_another_directory(tmp_path):
    python = _fresh_venv(tmp_path / "venv")
    src = _copy_sources(tmp_path / "src")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(src)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(src)  # the installed copy must be all it needs
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}

    def run(*args: str) -> str:
        proc = subprocess.run(
            args, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    where = run(str(python), "-c", "import jaxrl_llm; print(jaxrl_llm.__file__)")
    assert Path(where.strip()).is_relative_to(tmp_path / "venv")
    shipped = run(
        str(python),
        "-c",
        "from jaxrl_llm.config import resolve_gin_file as r; "
        "print(r('configs/ppo_tiny.gin'), r('ppo_tiny.gin'), r('ppo_tiny'))",
    )
    assert len(set(shipped.split())) == 1
    assert Path(shipped.split()[0]).is_relative_to(tmp_path / "venv")
    kernel = "from jaxrl_llm.models import int8_cpu; print(int8_cpu.SOURCE.is_file())"
    assert run(str(python), "-c", kernel).strip() == "True"  # the int8 kernel's source
    tiny = [
        "RLConfig.steps=1",
        "DataConfig.val_size=4",
        "DataConfig.prompts_per_step=2",
        "RolloutConfig.n=2",
        "RolloutConfig.max_new_tokens=8",
        "AlgoConfig.mini_batches=1",
    ]
    out = run(
        str(tmp_path / "venv" / "bin" / "jaxrl-llm"),
        "train",
        "--run_dir=run",
        *(f"--gin_param={p}" for p in tiny),
    )
    assert '"run_dir": "run"' in out
    assert "RLConfig.name = 'grpo_tiny'" in (elsewhere / "run" / "config.gin").read_text()


def test_pyproject_lists_every_package():
    """pyproject.toml names the packages (configs/ is mapped onto `jaxrl_llm.configs`), so a
    new subpackage left off the list would be missing from every non-editable install."""
    import tomllib

    import setuptools

    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = setuptools.find_packages(str(REPO), include=["jaxrl_llm*"])
    assert sorted(settings["packages"]) == sorted([*found, "jaxrl_llm.configs"])
    assert settings["package-dir"] == {"jaxrl_llm.configs": "configs"}

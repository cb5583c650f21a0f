"""tpu_scripts/*.sh: --dry-run prints the exact gcloud commands; shellcheck-clean."""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "tpu_scripts"
WHERE = ["--name=rl", "--zone=europe-west4-b", "--project=proj"]


def dry_run(script: str, *args: str) -> list[list[str]]:
    out = subprocess.run(
        ["bash", str(SCRIPTS / script), "--dry-run", *WHERE, *args],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    return [shlex.split(line) for line in out.splitlines()]


def test_create():
    [cmd] = dry_run("create.sh", "--accelerator-type=v6e-8")
    assert cmd == ["gcloud", "compute", "tpus", "tpu-vm", "create", "rl",
                   "--zone=europe-west4-b", "--project=proj", "--accelerator-type=v6e-8",
                   "--version=v2-alpha-tpuv6e"]  # fmt: skip
    [cmd] = dry_run("create.sh", "--accelerator-type=v5p-64", "--version=tpu-ubuntu2204-base")
    assert cmd[-1] == "--version=tpu-ubuntu2204-base"


def test_setup_installs_jax_tpu_on_every_worker():
    pack, scp, ssh = dry_run("setup.sh")
    assert pack[0] == "tar" and "--null" in pack
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rl"]
    assert "--worker=all" in ssh and "bash tpu_scripts/install_worker.sh" in ssh[-1]
    assert "pip install -e '.[tpu]'" in (SCRIPTS / "install_worker.sh").read_text()


def test_launch_runs_train_everywhere_with_auto_distributed():
    [ssh] = dry_run("launch.sh", "--gin_file=configs/grpo_tiny.gin", '--gin_param=X="a b"')
    assert "--worker=all" in ssh
    remote = ssh[-1].removeprefix("--command=")
    assert "JAXRL_DISTRIBUTED=auto" in remote and "| tee train.log" in remote
    train = shlex.split(remote.split("&& jaxrl-llm ")[1].split(" 2>&1")[0])
    assert train == ["train", "--gin_file=configs/grpo_tiny.gin", '--gin_param=X="a b"']


def _worker(tmp_path: Path, jaxrl_llm: str | None) -> tuple[Path, Path]:
    """A worker's home after setup.sh: ~/jaxrl-llm, and its venv's `jaxrl-llm` when given."""
    home = tmp_path / "home"
    (home / "jaxrl-llm").mkdir(parents=True)
    if jaxrl_llm is not None:
        fake = home / "jaxrl-llm" / ".venv" / "bin" / "jaxrl-llm"
        fake.parent.mkdir(parents=True)
        fake.write_text(f"#!/usr/bin/env bash\n{jaxrl_llm}\n")
        fake.chmod(0o755)
    return home, home / "jaxrl-llm" / "train.log"


def _run_remote(remote: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", remote], cwd=home, env={**os.environ, "HOME": str(home)},
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def test_launch_reports_a_failed_run_as_failed(tmp_path):
    """The command each worker runs, run here by bash with a venv `jaxrl-llm` that fails: its
    exit status is the run's, not `tee`'s (a crashed run must not read as a good one)."""
    [ssh] = dry_run("launch.sh", "--gin_file=configs/grpo_tiny.gin")
    home, log = _worker(tmp_path, "echo 'Traceback: training failed' >&2; exit 3")
    r = _run_remote(ssh[-1].removeprefix("--command="), home)
    assert r.returncode == 3, r.stderr
    assert "training failed" in log.read_text()


def test_launch_runs_the_venv_jaxrl_llm(tmp_path):
    """setup.sh installs into ~/jaxrl-llm/.venv (Python 3.11+); launch runs that `jaxrl-llm`,
    and names setup.sh when a worker has none."""
    [ssh] = dry_run("launch.sh", "--gin_file=configs/grpo_tiny.gin")
    remote = ssh[-1].removeprefix("--command=")
    home, log = _worker(tmp_path, 'echo "venv $*"')
    assert _run_remote(remote, home).returncode == 0
    assert log.read_text() == "venv train --gin_file=configs/grpo_tiny.gin\n"
    home, _ = _worker(tmp_path / "bare", None)
    r = _run_remote(remote, home)
    assert r.returncode == 2 and "tpu_scripts/setup.sh" in r.stderr


def test_multi_host_examples_share_one_run_dir():
    """Every host of a slice writes its part of each Orbax checkpoint into --run_dir: the
    launch examples (docs/tpu.md, launch.sh's usage) give a gs:// one, never a local one."""
    docs = (SCRIPTS.parent / "docs" / "tpu.md").read_text()
    usage = (SCRIPTS / "launch.sh").read_text().split("source ")[0]
    run_dirs = re.findall(r"--run_dir=(\S+)", docs + usage)
    assert run_dirs and all(d.startswith("gs://") for d in run_dirs), run_dirs


def test_delete():
    delete = ["gcloud", "compute", "tpus", "tpu-vm", "delete", "rl", *WHERE[1:], "--quiet"]
    assert dry_run("delete.sh") == [delete]
    assert dry_run("delete.sh", "--stop")[0][4] == "stop"


def test_unknown_option_fails():
    r = subprocess.run(["bash", str(SCRIPTS / "create.sh"), "--dry-run", "--bogus"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode != 0 and "unknown option" in r.stderr


def test_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    scripts = sorted(str(p) for p in SCRIPTS.glob("*.sh"))
    r = subprocess.run(["shellcheck", "-x", *scripts], capture_output=True, text=True,
                       timeout=60, cwd=SCRIPTS)  # fmt: skip
    assert r.returncode == 0, r.stdout

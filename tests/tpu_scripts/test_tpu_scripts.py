"""tpu_scripts/*.sh: --dry-run prints the exact gcloud commands; shellcheck-clean."""

import os
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
    tar, scp, ssh = dry_run("setup.sh")
    assert tar[0] == "tar" and "--exclude=.venv" in tar
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rl"]
    assert "--worker=all" in ssh and "pip install -e '.[tpu]'" in ssh[-1]


def test_launch_runs_train_everywhere_with_auto_distributed():
    [ssh] = dry_run("launch.sh", "--gin_file=configs/grpo_tiny.gin", '--gin_param=X="a b"')
    assert "--worker=all" in ssh
    remote = ssh[-1].removeprefix("--command=")
    assert "JAXRL_DISTRIBUTED=auto" in remote and "| tee train.log" in remote
    train = shlex.split(remote.split("&& jaxrl-llm ")[1].split(" 2>&1")[0])
    assert train == ["train", "--gin_file=configs/grpo_tiny.gin", '--gin_param=X="a b"']


def test_launch_reports_a_failed_run_as_failed(tmp_path):
    """The command each worker runs, run here by bash with a `jaxrl-llm` that fails: its exit
    status is the run's, not `tee`'s (a crashed run must not read as a good one)."""
    [ssh] = dry_run("launch.sh", "--gin_file=configs/grpo_tiny.gin")
    remote = ssh[-1].removeprefix("--command=")
    home, bin_dir = tmp_path / "home", tmp_path / "home" / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    (home / "jaxrl-llm").mkdir()
    fake = bin_dir / "jaxrl-llm"
    fake.write_text("#!/usr/bin/env bash\necho 'Traceback: training failed' >&2\nexit 3\n")
    fake.chmod(0o755)
    r = subprocess.run(["bash", "-c", remote], cwd=home, env={**os.environ, "HOME": str(home)},
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert "training failed" in (home / "jaxrl-llm" / "train.log").read_text()


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

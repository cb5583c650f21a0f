"""tpu_scripts/stage.sh: copies gs:// checkpoints and data to one local folder on every worker."""

import shlex
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tpu_scripts" / "stage.sh"


def _stage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--name=rl", "--zone=z", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_stage_copies_every_source_into_the_folder_on_all_workers():
    proc = _stage("--to=/ckpts", "gs://b/Qwen2.5-Math-7B", "gs://b/limr/math 8k.json")
    assert proc.returncode == 0, proc.stderr
    [ssh] = [shlex.split(line) for line in proc.stdout.splitlines()]
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rl"]
    assert "--worker=all" in ssh
    remote = shlex.split(ssh[-1].removeprefix("--command="))
    assert remote == [
        "mkdir", "-p", "/ckpts", "&&", "gcloud", "storage", "cp", "-r",
        "gs://b/Qwen2.5-Math-7B", "gs://b/limr/math 8k.json", "/ckpts/",
    ]  # fmt: skip


def test_stage_refuses_a_relative_target_or_a_local_source():
    proc = _stage("--to=ckpts", "gs://b/x")
    assert proc.returncode == 2 and "absolute" in proc.stderr
    proc = _stage("--to=/ckpts", "/home/me/x")
    assert proc.returncode == 2 and "gs://" in proc.stderr

"""A whole RL run with `RLConfig.run_dir = "gs://..."`: every file lands under the bucket
(epath's mock backend maps gs:// into a folder), `--resume` continues from it, and the
readers (`samples`, `plot`, LIMR scores, `export`) take the gs:// run.

Orbax writes checkpoint arrays through TensorStore's own GCS driver, which no epath mock
reaches; there the checkpoint directory the run builds (a gs:// URI under run_dir) is
checked, then mapped to a local folder beside the bucket's (not inside it: the mock's
listings would turn its paths back into gs:// URIs, which TensorStore would then open)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaxrl_llm.config import parse_gin
from jaxrl_llm.data.limr import score_run
from jaxrl_llm.learner import checkpoint
from jaxrl_llm.learner.export import export_policy
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.metrics import read_metrics
from jaxrl_llm.metrics.generations import read_generations
from jaxrl_llm.metrics.plots import write_dashboard
from jaxrl_llm.testing import register_test_rewards

from ..test_cloud_paths import PREFIX, fake_gcs
from .rl_helpers import TINY_RL_PARAMS

pytestmark = pytest.mark.slow
RUN = "gs://b/run"


@pytest.fixture
def bucket(tmp_path, monkeypatch) -> Iterator[Path]:
    """gs:// mapped to a folder; checkpoints to another (see the module docstring). The
    test runs in its own folder, where a stray local `gs:` directory would show."""
    root, cwd = tmp_path / "gcs", tmp_path / "cwd"
    root.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    register_test_rewards()  # 'digit_fraction', named by TINY_RL_PARAMS
    to_orbax = checkpoint.checkpoint_directory

    def mapped(directory):
        assert os.fspath(directory) == f"{RUN}/checkpoints", directory
        return to_orbax(tmp_path / "tensorstore" / os.fspath(directory)[len(PREFIX) :])

    monkeypatch.setattr(checkpoint, "checkpoint_directory", mapped)
    with fake_gcs(root):
        yield root
    assert not (cwd / "gs:").exists(), "a gs:// path was written as a local folder"


def _config(*extra: str) -> RLConfig:
    parse_gin([], [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{RUN}'", *extra])
    return RLConfig()


def test_a_gcs_run_writes_every_file_there_and_resumes(bucket, tmp_path, caplog):
    settings = ("RLConfig.steps = 2", "RLConfig.save_every = 1", "RLConfig.eval_every = 2")
    first = run_rl(_config(*settings), stop_after=1)
    assert [r["step"] for r in first] == [0, 1]  # step 0: validation before training
    with caplog.at_level(logging.INFO, logger="jaxrl_llm.learner.run"):
        second = run_rl(_config(*settings), resume=True)
    assert "step 1" in caplog.text and "resumed from" in caplog.text
    assert [r["step"] for r in second] == [2]

    run = bucket / "b" / "run"
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    for name in ["config.gin", "dashboard.png", "hf/config.json", "hf/model.safetensors"]:
        assert (run / name).is_file(), name
    for folder in ["samples", "generations"]:
        assert sorted(p.name for p in (run / folder).iterdir()) == ["step_1.jsonl", "step_2.jsonl"]
    ckpts = tmp_path / "tensorstore" / "b" / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.isdigit()) == ["1", "2"]
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) >= 3 and all(p.stat().st_size > 0 for p in events)  # 2 metrics, 1+ text

    step, records = read_generations(RUN)
    assert step == 2 and len(records) == 8 and records[0]["step"] == 2
    assert write_dashboard([RUN], "gs://b/plots", per_group=False)[0].name == "dashboard.png"
    assert (bucket / "b" / "plots" / "dashboard.png").stat().st_size > 10_000
    scores = score_run(RUN, steps_per_epoch=1, epochs=2)
    assert len(scores.ids) + len(scores.dropped) == 4  # prompts_per_step 2, over 2 steps
    assert (run / "lim_scores.json").is_file()
    assert export_policy(RUN, "gs://b/export") == 2
    exported = (bucket / "b" / "export" / "model.safetensors").read_bytes()
    assert exported == (run / "hf" / "model.safetensors").read_bytes()  # checkpoint 2 = final

"""`jaxrl-llm train --resume` where the run cannot be continued as it was ends with one line
(exit 2) before anything is written: no complete checkpoint to resume (a mistyped --run_dir;
every step moved aside as the docs advise for damaged ones), and batches sampled ahead with
another `RolloutConfig.n` than the resumed run's (GRPO would regroup their baseline)."""

import json

import jax.numpy as jnp
import pytest

from jaxrl_llm import cli
from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner.checkpoint import Checkpointer
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.learner.rl_loop import run_rl
from jaxrl_llm.testing import register_test_rewards

from .rl_helpers import TINY_RL_PARAMS

ERROR = "jaxrl-llm train: configuration error: "
STATE = {"policy": {"params": {"w": jnp.arange(6.0).reshape(2, 3)}}}


def _train(run_dir, *params, resume=True):
    register_test_rewards()
    argv = ["train", "--gin_file", "base.gin", "--run_dir", str(run_dir)]
    for p in [*TINY_RL_PARAMS, *params]:
        argv += ["--gin_param", p]
    return cli.main([*argv, *(["--resume"] if resume else [])])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith(ERROR), err[-1]
    return err[-1]


def test_resume_of_a_run_dir_that_does_not_exist_writes_nothing(tmp_path, capsys):
    typo = tmp_path / "runs" / "grpo_typo"
    assert _train(typo) == 2
    line = _one_line(capsys)
    assert str(typo / "checkpoints") in line and "no complete checkpoint" in line, line
    assert "drop --resume" in line and "--run_dir" in line, line
    assert not (tmp_path / "runs").exists()


def _run_without_complete_steps(run_dir, incomplete):
    """A run's folder whose steps were all moved aside (2, 3), or left incomplete (4)."""
    ckpts = run_dir / "checkpoints"
    writer = Checkpointer(ckpts)
    for step in (2, 3):
        writer.save(step, STATE, {"step": step})
    writer.close()
    for step in (2, 3):
        (ckpts / str(step)).rename(ckpts / f"{step}.damaged")
    if incomplete:
        (ckpts / "4").mkdir()
    rows = "".join(json.dumps({"step": s, "critic/score/mean": s / 10}) + "\n" for s in range(1, 5))
    (run_dir / "metrics.jsonl").write_text(rows)
    return rows


@pytest.mark.parametrize("incomplete", [False, True])
def test_resume_with_every_step_moved_aside_keeps_the_runs_metrics(tmp_path, capsys, incomplete):
    run_dir = tmp_path / "run"
    rows = _run_without_complete_steps(run_dir, incomplete)
    before = sorted(p.name for p in run_dir.rglob("*"))
    assert _train(run_dir) == 2
    line = _one_line(capsys)
    assert str(run_dir / "checkpoints") in line and "no complete checkpoint" in line, line
    assert "2.damaged" in line and "3.damaged" in line, line
    assert ("incomplete steps [4]" in line) == incomplete, line
    assert (run_dir / "metrics.jsonl").read_text() == rows
    assert sorted(p.name for p in run_dir.rglob("*")) == before  # no hf/, nothing removed


@pytest.mark.slow  # one overlapped 1-step run (about 15 s)
def test_resume_of_batches_sampled_ahead_with_another_group_size_is_refused(tmp_path, capsys):
    """Checkpoint 1 of an overlapped run holds step 2's batch, sampled with n = 4: a resume
    with n = 2 would train its 8 samples as 4 groups of 2."""
    register_test_rewards()
    run_dir = tmp_path / "run"
    overlapped = ["RLConfig.steps = 2", "RLConfig.save_every = 1", "RLConfig.max_staleness = 1"]
    parse_gin([], [*TINY_RL_PARAMS, f"RLConfig.run_dir = '{run_dir}'", *overlapped])
    run_rl(RLConfig(), stop_after=1)
    metrics = (run_dir / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert _train(run_dir, *overlapped, "RolloutConfig.n = 2") == 2
    line = _one_line(capsys)
    assert str(run_dir / "checkpoints" / "1") in line, line
    assert "RolloutConfig.n = 4" in line and "[2]" in line and "new run_dir" in line, line
    assert (run_dir / "metrics.jsonl").read_text() == metrics

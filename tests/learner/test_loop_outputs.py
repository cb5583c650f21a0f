"""What the RL loop writes besides the update: the dashboard of a run without validation,
the step-0 record, TensorBoard switched off, and the all-equal-groups metric only for an
estimator with a group baseline."""

import numpy as np
import pytest

from jaxrl_llm.algorithms import registry
from jaxrl_llm.config import parse_gin
from jaxrl_llm.learner import rl_loop
from jaxrl_llm.learner.rl_config import RLConfig
from jaxrl_llm.metrics import read_metrics
from jaxrl_llm.testing import register_test_rewards

from .rl_helpers import TINY_RL_PARAMS

FRAC = "batch/all_equal_groups_frac"


def _config(*extra: str) -> RLConfig:
    parse_gin([], [*TINY_RL_PARAMS, *extra])
    return RLConfig()


def _run_without_validation(run) -> list[dict]:
    """One step of the tiny model, 2 prompts x 1 sample, 4 new tokens; eval_every = 1 but
    no validation prompts (val_size = 0, as a train_file without a val_file)."""
    register_test_rewards()
    return rl_loop.run_rl(
        _config(
            f"RLConfig.run_dir = '{run}'", "RLConfig.steps = 1", "RLConfig.eval_every = 1",
            "RLConfig.save_every = 0", "DataConfig.val_size = 0", "RolloutConfig.n = 1",
            "RolloutConfig.max_new_tokens = 4", "AlgoConfig.mini_batches = 1",
            "AlgoConfig.estimator = 'reinforce_plus_plus'", "MetricsConfig.tensorboard = False",
        )
    )  # fmt: skip


@pytest.mark.slow  # measured: 16 s on 2 shared cores, compiled programs cached
def test_run_without_validation_draws_its_dashboard_and_no_empty_step_0(tmp_path):
    """The dashboard is drawn at the end, no empty {"step": 0} row is written (no
    validation), step 1's row holds what building the data kept and dropped; TensorBoard
    off writes no event files (the generations log included); REINFORCE++ with n = 1 has
    no groups, so no all-equal-groups fraction."""
    run = tmp_path / "run"
    records = _run_without_validation(run)
    seen = {
        "steps written": [r["step"] for r in read_metrics(run)],
        "dashboard.png": (run / "dashboard.png").exists(),
        "tensorboard files": sorted(p.name for p in run.rglob("*tfevents*")),
        FRAC: [r["step"] for r in records if FRAC in r],
    }
    expected = {"steps written": [1], "dashboard.png": True, "tensorboard files": [], FRAC: []}
    assert seen == expected
    # The built-in task's 16 training rows (builtin_train_size), none dropped.
    data = {k: v for k, v in read_metrics(run)[0].items() if k.startswith("data/")}
    assert data == {
        "data/rows_read": 16.0, "data/malformed_rows": 0.0, "data/filtered_too_long": 0.0,
        "data/prompts": 16.0,
    }  # fmt: skip


@pytest.mark.slow  # as above
def test_a_run_ending_in_an_error_still_draws_its_dashboard(tmp_path, monkeypatch):
    def failing_export(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(rl_loop, "export_final", failing_export)
    with pytest.raises(OSError, match="disk full"):
        _run_without_validation(tmp_path / "run")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]
    assert (tmp_path / "run" / "dashboard.png").exists()


@pytest.mark.parametrize(
    ("estimator", "n", "emitted"),
    [("grpo", 4, True), ("rloo", 2, True), ("gae", 4, False), ("reinforce_plus_plus", 1, False),
     ("reinforce_plus_plus", 4, False), ("reinforce_plus_plus_baseline", 4, True),
     ("reinforce_plus_plus_baseline", 1, False)],
)  # fmt: skip
def test_all_equal_groups_frac_only_for_a_group_baseline(estimator, n, emitted):
    cfg = _config(f"AlgoConfig.estimator = '{estimator}'", f"RolloutConfig.n = {n}")
    scores = np.array([1.0] * n + [0.0] * n + [1.0] + [0.0] * (n - 1), np.float32)  # 3 groups
    got = rl_loop.group_metrics(cfg, scores)
    # Group 1 and 2 are all equal; group 3 is mixed when n > 1.
    assert got == ({FRAC: 2 / 3} if emitted else {})


def test_all_equal_groups_frac_follows_the_registered_capability_not_the_name():
    def fake_group_estimator(token_rewards, response_mask, *, values=None, group_size):
        raise AssertionError("never called")

    registry.register("advantage", "test_group_baseline", group_baseline=True)(fake_group_estimator)
    try:
        cfg = _config("AlgoConfig.estimator = 'test_group_baseline'", "RolloutConfig.n = 2")
        got = rl_loop.group_metrics(cfg, np.array([1.0, 1.0, 0.0, 1.0], np.float32))
    finally:
        registry.unregister("advantage", "test_group_baseline")
    assert got == {FRAC: 0.5}

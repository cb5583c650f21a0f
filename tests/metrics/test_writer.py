"""MetricsWriter: jsonl always, TensorBoard by default, W&B only when asked for and installed
(checked with a fake `wandb` module: no network, no account)."""

from __future__ import annotations

import json
import math
import sys
import types

import gin
import pytest

from jaxrl_llm.config import ConfigError, parse_gin
from jaxrl_llm.metrics import MetricsConfig, MetricsWriter, read_metrics


class FakeWandb(types.ModuleType):
    """Records what `wandb.init`, `run.log` and `run.finish` were called with."""

    def __init__(self):
        super().__init__("wandb")
        self.inits: list[dict] = []
        self.logs: list[tuple[dict, int]] = []
        self.finished = 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, data, step):
        self.logs.append((data, step))

    def finish(self):
        self.finished += 1


@pytest.fixture
def fake_wandb(monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return fake


def test_wandb_gets_each_record_when_a_project_is_set(tmp_path, fake_wandb):
    cfg = MetricsConfig(tensorboard=False, wandb_project="rl", wandb_entity="me")
    writer = MetricsWriter(tmp_path / "run", config=cfg)
    writer.write(1, {"actor/pg_loss": 0.5, "note": "text"})
    writer.write(2, {"actor/pg_loss": float("nan")})
    writer.close()
    [init] = fake_wandb.inits
    assert (init["project"], init["entity"], init["name"]) == ("rl", "me", "run")
    assert fake_wandb.logs[0] == ({"actor/pg_loss": 0.5}, 1)
    assert math.isnan(fake_wandb.logs[1][0]["actor/pg_loss"]) and fake_wandb.logs[1][1] == 2
    assert fake_wandb.finished == 1
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, fake_wandb):
    cfg = MetricsConfig(tensorboard=False, wandb_project="rl")
    MetricsWriter(tmp_path, config=cfg).close()
    MetricsWriter(tmp_path, config=cfg, resume_step=0).close()
    MetricsWriter(tmp_path, config=cfg).close()  # a fresh start in the same folder: new id
    ids = [i["id"] for i in fake_wandb.inits]
    assert ids[0] == ids[1] != ids[2]
    assert all(i["resume"] == "allow" for i in fake_wandb.inits)


def test_no_project_means_no_wandb(tmp_path, fake_wandb):
    MetricsWriter(tmp_path, config=MetricsConfig(tensorboard=False)).write(1, {"x": 1.0})
    assert fake_wandb.inits == [] and fake_wandb.logs == []


def test_wandb_not_installed_warns_and_writes_the_rest(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    writer = MetricsWriter(tmp_path, config=MetricsConfig(wandb_project="rl"))
    writer.write(1, {"x": 1.0})
    writer.close()
    assert "wandb is not installed" in caplog.text
    assert read_metrics(tmp_path) == [{"step": 1, "x": 1.0}]
    assert (tmp_path / "tensorboard").is_dir()


def test_the_gin_binding_reaches_the_writer(tmp_path, fake_wandb):
    parse_gin([], ["MetricsConfig.wandb_project = 'from-gin'", "MetricsConfig.tensorboard = False"])
    try:
        MetricsWriter(tmp_path).close()
    finally:
        gin.clear_config()
    assert fake_wandb.inits[0]["project"] == "from-gin"
    assert not (tmp_path / "tensorboard").exists()


def test_a_wrong_type_is_named():
    with pytest.raises(ConfigError, match=r"MetricsConfig.wandb_project = 3: expected str"):
        MetricsConfig(wandb_project=3)  # type: ignore[arg-type]


def test_non_finite_values_reach_tensorboard_and_wandb(tmp_path, fake_wandb, monkeypatch):
    """A NaN loss is what a dashboard must show: TensorBoard and W&B get the float at its
    step; only metrics.jsonl (strict JSON) holds it as a string."""
    import jaxrl_llm.metrics.writer as writer_module

    scalars: list[tuple[str, float, int]] = []

    class RecordingSummary:
        def add_scalar(self, tag, value, step):
            scalars.append((tag, value, step))

        def flush(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(writer_module, "summary_writer", lambda run_dir, **_: RecordingSummary())
    writer = MetricsWriter(tmp_path, config=MetricsConfig(wandb_project="p"))
    for step, value in enumerate([0.5, float("nan"), float("inf"), 0.25], 1):
        writer.write(step, {"actor/pg_loss": value})
    writer.close()
    assert [step for _, _, step in scalars] == [1, 2, 3, 4]
    assert math.isnan(scalars[1][1]) and scalars[2][1] == math.inf
    assert math.isnan(fake_wandb.logs[1][0]["actor/pg_loss"])
    assert fake_wandb.logs[2][0]["actor/pg_loss"] == math.inf
    assert [r["actor/pg_loss"] for r in read_metrics(tmp_path)] == [0.5, "nan", "inf", 0.25]


def test_a_resume_reads_past_a_line_that_is_not_an_object(tmp_path, caplog):
    """A hand-edited metrics.jsonl with a `null` line: the resumed writer keeps the records
    up to its step and drops that line with a warning naming it (it crashed with
    AttributeError on `None.get`); a torn last line is skipped as before."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\nnull\n{"step": 2, "a": 2}\n{"step": 3, "a"')
    MetricsWriter(tmp_path, config=MetricsConfig(tensorboard=False), resume_step=2).close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 1, "a": 1}, {"step": 2, "a": 2},
    ]  # fmt: skip
    assert "skipped line(s) [2]: not JSON objects" in caplog.text

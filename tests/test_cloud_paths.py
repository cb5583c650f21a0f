"""Run outputs and data files on `gs://` go through `etils.epath`: checked against a fake GCS
(epath's own `testing.mock_epath`, each gs:// path mapped into a temporary folder), so a
path that is silently treated as local (`pathlib.Path("gs://b")` is the folder `gs:/b`)
fails here."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import gin
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from etils.epath import gpath
from etils.epath import testing as epath_testing

from jaxrl_llm.config import parse_gin, write_resolved_config
from jaxrl_llm.data.sources import DataSourceError, SourceConfig, read_records
from jaxrl_llm.learner.checkpoint import Checkpointer, checkpoint_directory
from jaxrl_llm.metrics import MetricsConfig, MetricsWriter, read_metrics

PREFIX = "gs://"


@contextlib.contextmanager
def fake_gcs(root: Path) -> Iterator[None]:
    """epath's gs:// backend mapped into the folder `root` (gs://b/x is root/b/x)."""

    def local(path) -> str:
        s = os.fspath(path)
        return str(root / s[len(PREFIX) :]) if s.startswith(PREFIX) else s

    def remote(path: str) -> str:
        rel = os.path.relpath(path, root)
        return path if rel.startswith("..") else PREFIX + rel

    def one(fn, path, *args, **kwargs):
        return fn(local(path), *args, **kwargs)

    def two(fn, path, dst, *args, **kwargs):
        return fn(local(path), local(dst), *args, **kwargs)

    def walk(fn, path, **kwargs):
        for top, dirs, files in fn(local(path), **kwargs):
            yield remote(top), dirs, files

    def glob(fn, path):
        return [remote(p) for p in fn(local(path))]

    fake = {
        name: one for name in ("exists", "isdir", "listdir", "makedirs", "mkdir", "open", "remove")
    }
    fake.update(rmtree=one, stat=one, rename=two, replace=two, copy=two, walk=walk, glob=glob)
    # As the CLI sets it: gs:// through epath's own (mocked) backend, not TensorFlow's GCS
    # client. epath reads EPATH_USE_TF once per process (`_is_tf_installed` is cached on the
    # first path operation, local ones included), so a test that ran earlier with TF
    # installed and the variable unset left TF's backend chosen, which this mock never
    # reaches: the cache is cleared on the way in and out.
    with mock.patch.dict(os.environ, {"EPATH_USE_TF": "false"}):
        gpath._is_tf_installed.cache_clear()
        try:
            with epath_testing.mock_epath(**fake):
                yield
        finally:
            gpath._is_tf_installed.cache_clear()


@pytest.fixture
def bucket(tmp_path, monkeypatch) -> Iterator[Path]:
    """The local folder standing for gs://; the test runs in another folder, so a stray
    local `gs:` directory would show."""
    root = tmp_path / "gcs"
    root.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with fake_gcs(root):
        yield root
    assert not (cwd / "gs:").exists(), "a gs:// path was written as a local folder"


def test_data_files_and_folders_read_from_gcs(bucket):
    (bucket / "d").mkdir()
    rows = [{"prompt": "1+1", "answer": "2"}, {"prompt": "2+2", "answer": "4"}]
    (bucket / "d" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), bucket / "d" / "train.parquet")
    (bucket / "hub" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), bucket / "hub" / "data" / "train-0.parquet")
    for path, fmt in [
        ("gs://d/train.jsonl", "auto"),
        ("gs://d/train.parquet", "auto"),
        ("gs://hub", "hf"),
    ]:
        records = list(read_records(SourceConfig(path, format=fmt)))
        assert [r.row for r in records] == rows, path
        assert records[0].source.startswith(PREFIX)
    with pytest.raises(DataSourceError, match=r"'gs://d/missing\.jsonl': no such file"):
        list(read_records(SourceConfig("gs://d/missing.jsonl")))


def test_metrics_and_resolved_config_write_to_gcs(bucket):
    run = "gs://runs/a"
    cfg = MetricsConfig(tensorboard=False)
    writer = MetricsWriter(run, config=cfg)
    for step in (1, 2, 3):
        writer.write(step, {"actor/pg_loss": 0.1 * step})
    writer.close()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    MetricsWriter(run, config=cfg, resume_step=2).close()  # resume drops steps after 2
    assert [r["step"] for r in read_metrics(bucket / "runs" / "a")] == [1, 2]
    parse_gin(["grpo_tiny.gin"])
    try:
        path = write_resolved_config(run)
    finally:
        gin.clear_config()
    assert os.fspath(path) == "gs://runs/a/config.gin"
    assert (bucket / "runs" / "a" / "config.gin").is_file()


def test_a_gcs_checkpoint_directory_is_kept_as_a_uri(tmp_path, monkeypatch):
    """Orbax writes arrays through TensorStore's own GCS driver, which no epath mock
    reaches; without a bucket, what is checked is the directory Orbax is given."""
    monkeypatch.chdir(tmp_path)
    assert os.fspath(checkpoint_directory("gs://b/run/checkpoints")) == "gs://b/run/checkpoints"
    assert os.fspath(checkpoint_directory("run/checkpoints")) == str(tmp_path / "run/checkpoints")


def test_a_local_checkpoint_round_trips_through_epath(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = Checkpointer("rel/checkpoints")  # relative: made absolute for Orbax
    assert os.fspath(ckpt.directory) == str(tmp_path / "rel" / "checkpoints")
    state = {"w": jnp.arange(6.0).reshape(2, 3)}
    ckpt.save(1, state, {"data": {"pos": 4}})
    restored, extra = ckpt.restore(1, state)
    ckpt.close()
    np.testing.assert_allclose(np.asarray(restored["w"]), np.arange(6.0).reshape(2, 3))
    assert extra == {"data": {"pos": 4}}

"""The TFDS source on TFDS's own mock data (no download). Kept in its own module: TF is slow."""

import sys
import tempfile

import pytest

from jaxrl_llm.data.examples import load_examples
from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.sources import SourceConfig

tfds = pytest.importorskip("tensorflow_datasets")


@pytest.fixture(autouse=True)
def _tfds_temp_dirs_in_tmp_path(tmp_path, monkeypatch):
    # TFDS's DatasetInfo makes an empty mkdtemp("tfds") per builder and never removes it.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


# math_dataset has text features "question" and "answer", which the default FieldMap reads.
NAME = "math_dataset/arithmetic__mul"


def test_importing_the_data_package_does_not_import_tfds():
    import subprocess

    code = "import sys, jaxrl_llm.data; print('tensorflow_datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_tfds_source_reads_mock_data(tmp_path):
    source = SourceConfig(NAME, format="tfds", split="train", data_dir=str(tmp_path))
    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        examples, report = load_examples(source)
    assert report.rows_read == 6 and report.malformed == []
    assert [ex["id"] for ex in examples] == [f"train:{i}" for i in range(1, 7)]
    for ex in examples:
        assert isinstance(ex["prompt"], str) and isinstance(ex["answer"], str)


def test_tfds_source_feeds_the_pipeline_deterministically(tmp_path, char_tokenizer):
    cfg = PipelineConfig(
        SourceConfig(NAME, format="tfds", data_dir=str(tmp_path)),
        global_batch_size=2,
        num_epochs=2,
        max_prompt_length=512,
        seed=3,
    )
    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        first = [b.ids for b in build_prompt_pipeline(cfg, char_tokenizer).iterator()]
        second = [b.ids for b in build_prompt_pipeline(cfg, char_tokenizer).iterator()]
    assert first == second and len(first) == 6
    assert sorted(pid for batch in first[:3] for pid in batch) == [
        f"train:{i}" for i in range(1, 7)
    ]
